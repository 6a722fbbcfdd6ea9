"""The server pool's parts on their own: the worker's GPU claimer (claimed once, re-claimed
for another size, given back to its session, spare GPUs for replicas) and its server slot
(started, reused, restarted once, stopped), with fake GPUs and a fake server."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from pytest_modelbench.errors import EvaluationError, ModelbenchUsageError
from pytest_modelbench.serving.base import ServerStartError
from pytest_modelbench.serving.gpu_claims import LOCK_DIR_ENV, NoFreeGpuError, session_gpus
from pytest_modelbench.serving.gpu_discovery import FAKE_ENV, GpuWarning
from pytest_modelbench.serving.gpus import GpuClaimer
from pytest_modelbench.serving.slot import Launch, ServerDiedWarning, ServerSlot


@pytest.fixture
def four_gpus(gpu_env: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    locks = tmp_path / "locks"
    gpu_env.setenv(FAKE_ENV, "0:0,1:0,2:0,3:0")
    gpu_env.setenv(LOCK_DIR_ENV, str(locks))
    return locks


def test_the_claimer_claims_once_and_again_for_another_size(four_gpus: Path) -> None:
    claimer = GpuClaimer(None, "s1")
    assert claimer.gpus(1, "m") == ("0",)
    assert claimer.gpus(1, "m") == ("0",)  # kept, not claimed twice
    with pytest.warns(GpuWarning, match="models.m.serve.gpus: 2 runs every server"):
        assert claimer.gpus(2, "m") == ("0", "1")  # released, then two claimed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        claimer.gpus(2, "m")  # the tensor-parallel warning once per model
    claimer.close()
    assert session_gpus("s1") == ("0", "1")  # given back to the session, for replicas
    assert claimer.held is None


def test_spare_gpus_are_those_the_session_gave_back(four_gpus: Path) -> None:
    keeper, leaver = GpuClaimer(None, "s1"), GpuClaimer(None, "s1")
    assert keeper.gpus(1, "m") == ("0",) and leaver.gpus(1, "m") == ("1",)
    assert keeper.spare(1) is None  # nothing given back yet (2 and 3 are free, not given)
    leaver.close()
    spare = keeper.spare(1)
    assert spare is not None and spare.gpus == ("1",)
    assert keeper.spare(1) is None  # held by the first spare claim
    spare.release()
    keeper.close()


def test_no_free_gpu_waits_only_for_the_sessions_own_workers(four_gpus: Path) -> None:
    holders = [GpuClaimer(None, "s1") for _ in range(4)]
    for n, holder in enumerate(holders):
        assert holder.gpus(1, "m") == (str(n),)
    with pytest.raises(NoFreeGpuError):  # the session's own workers: share or wait
        GpuClaimer(None, "s1").gpus(1, "m")
    with pytest.raises(EvaluationError, match="GPU"):  # another session's: fail
        GpuClaimer(None, "s2").gpus(1, "m")
    with pytest.raises(ModelbenchUsageError, match="--gpus"):
        GpuClaimer("0,x", "s1").gpus(1, "m")
    for holder in holders:
        holder.close()


class FakeServer:
    """What the slot needs of a server; dies on demand, restarts unless told to fail."""

    def __init__(self, fail_start: bool = False) -> None:
        self.base_url = "http://127.0.0.1:1/v1"
        self.served_name = "m"
        self.alive = False
        self.fail_start = fail_start
        self.calls: list[str] = []

    def start(self, deadline_s: float) -> None:
        self.calls.append(f"start {deadline_s:g}")
        if self.fail_start:
            raise ServerStartError("did not start")
        self.alive = True

    def restart(self, deadline_s: float | None = None) -> None:
        self.calls.append(f"restart {deadline_s}")
        self.alive = True

    def stop(self) -> None:
        self.calls.append("stop")
        self.alive = False

    def is_alive(self) -> bool:
        return self.alive

    def death_report(self) -> str | None:
        return None if self.alive else "the server died (exit code 1): OOM; log: x.log"


LAUNCH = Launch("m", "org/m", "org/m", {}, 1, 60.0)


def test_the_slot_restarts_a_dead_server_once(tmp_path: Path) -> None:
    slot, server = ServerSlot(tmp_path, "gw0"), FakeServer()
    seen: list[Launch | None] = []
    slot.start("m", LAUNCH, server, starting=lambda: seen.append(slot.launch))  # type: ignore[arg-type]
    assert seen == [LAUNCH]  # replicas see the launch before the start
    assert slot.holds("m") and not slot.holds("other") and slot.starts == 1
    assert slot.address() == ("http://127.0.0.1:1/v1", "m")
    server.alive = False
    with pytest.warns(ServerDiedWarning, match=r"m: the server died .*: OOM.*; restarting it once"):
        slot.restart()
    assert server.calls == ["start 60", "restart None"] and slot.starts == 1
    server.alive = False
    assert not slot.may_restart()
    with pytest.raises(EvaluationError, match=r"OOM.*died again after one restart"):
        slot.restart()
    slot.stop()
    assert server.calls[-1] == "stop" and slot.server is None and slot.launch is None


def test_a_failed_start_leaves_the_slot_empty(tmp_path: Path) -> None:
    slot, server = ServerSlot(tmp_path, "gw0"), FakeServer(fail_start=True)
    with pytest.raises(ServerStartError):
        slot.start("m", LAUNCH, server)  # type: ignore[arg-type]
    assert slot.server is None and slot.starts == 0
    assert slot.launch is LAUNCH  # held until the replicas that read it have stopped
    slot.forget_launch()
    assert slot.launch is None
