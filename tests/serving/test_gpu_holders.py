"""Who holds a busy GPU (issue 38): NVML's process list with each holder's user and command,
the GPU's utilisation, memory held at 0% for a sustained window flagged as a likely leftover,
and ``modelbench gpus``. A fake NVML module stands in for ``nvidia-ml-py``; the holders are
real processes of this machine, which modelbench never stops."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_modelbench.cli import main
from pytest_modelbench.serving.gpu_claims import NoFreeGpuError, claim
from pytest_modelbench.serving.gpu_discovery import GpuWarning

GIB = 2**30
CODE = "print('ready', flush=True); import time; time.sleep(120)"


def fake_nvml(devices: list[dict[str, object]]) -> types.ModuleType:
    """nvidia-ml-py as NVML answers: per device ``used`` bytes, ``pids`` {pid: bytes},
    ``util`` samples [(seconds, percent)]."""
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def not_mig(handle: int) -> list[int]:
        raise NVMLError("Not Supported")

    def processes(handle: int) -> list[types.SimpleNamespace]:
        pids = devices[handle]["pids"]
        assert isinstance(pids, dict)
        return [types.SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in pids.items()]

    def samples(handle: int, kind: int, since: int) -> tuple[int, list[types.SimpleNamespace]]:
        util = devices[handle]["util"]
        assert isinstance(util, list)
        return kind, [
            types.SimpleNamespace(
                timeStamp=int(t * 1e6), sampleValue=types.SimpleNamespace(uiVal=v)
            )
            for t, v in util
        ]

    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    nvml.NVML_GPU_UTILIZATION_SAMPLES = 1  # type: ignore[attr-defined]
    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetUUID = lambda h: f"GPU-{h:08d}"  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(  # type: ignore[attr-defined]
        used=devices[h]["used"], total=80 * GIB
    )
    nvml.nvmlDeviceGetMigMode = not_mig  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetComputeRunningProcesses = processes  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetGraphicsRunningProcesses = lambda _: []  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetSamples = samples  # type: ignore[attr-defined]
    return nvml


@pytest.fixture
def holder() -> Iterator[subprocess.Popen[bytes]]:
    """Another user's training job, as far as modelbench can tell: a process it must not stop."""
    proc = subprocess.Popen([sys.executable, "-c", CODE, "train.py"], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"  # running it now
    yield proc
    proc.kill()
    proc.wait()


def busy(pid: int, used: float, util: list[tuple[float, int]]) -> dict[str, object]:
    return {"used": int(used * GIB), "pids": {pid: int(used * GIB)}, "util": util}


def idle() -> dict[str, object]:
    return {"used": 300 * 2**20, "pids": {}, "util": [(0.0, 0), (20.0, 0)]}


def test_a_busy_gpu_names_its_holder(
    gpu_env: pytest.MonkeyPatch, tmp_path: Path, holder: subprocess.Popen[bytes]
) -> None:
    nvml = fake_nvml([busy(holder.pid, 21.2, [(0.0, 95), (1.0, 97)])])
    gpu_env.setitem(sys.modules, "pynvml", nvml)
    user = getpass.getuser()
    with (
        pytest.warns(GpuWarning) as caught,
        pytest.raises(NoFreeGpuError, match=rf"GPU 0: 21.2 GiB held by pid {holder.pid}"),
    ):
        claim(1, tmp_path)
    message = str(caught[0].message)
    assert (
        f"GPU 0 is busy: 21.2 GiB held by pid {holder.pid} (user {user}, "
        f"`{Path(sys.executable).name} -c {CODE} train.py`), 97% utilised"
    ) in message
    assert "leftover" not in message  # it computes
    assert holder.poll() is None  # never stopped


def test_memory_held_at_zero_percent_is_a_likely_leftover(
    gpu_env: pytest.MonkeyPatch, tmp_path: Path, holder: subprocess.Popen[bytes]
) -> None:
    nvml = fake_nvml([busy(holder.pid, 8.0, [(float(t), 0) for t in range(21)]), idle()])
    gpu_env.setitem(sys.modules, "pynvml", nvml)
    with pytest.warns(GpuWarning, match="GPU 0 is busy") as caught, claim(1, tmp_path) as got:
        assert got.gpus == ("1",)
    message = str(caught[0].message)
    assert "0% utilised over the last 20 s while holding 8.0 GiB: likely a leftover" in message
    assert f"pid {holder.pid} (user {getpass.getuser()}, `{Path(sys.executable).name} -c" in message
    assert holder.poll() is None


def test_a_short_quiet_spell_is_not_a_leftover(
    gpu_env: pytest.MonkeyPatch, tmp_path: Path, holder: subprocess.Popen[bytes]
) -> None:
    nvml = fake_nvml([busy(holder.pid, 8.0, [(0.0, 0), (2.0, 0)]), idle()])
    gpu_env.setitem(sys.modules, "pynvml", nvml)
    with pytest.warns(GpuWarning, match="0% utilised") as caught, claim(1, tmp_path):
        pass
    assert "leftover" not in str(caught[0].message)  # 2 s of samples: too short to say


def test_a_holder_not_visible_from_here(gpu_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid NVML lists that /proc does not show (another container)
    nvml = fake_nvml([busy(gone.pid, 4.0, [(0.0, 50)])])
    gpu_env.setitem(sys.modules, "pynvml", nvml)
    with (
        pytest.warns(
            GpuWarning, match=rf"4.0 GiB held by pid {gone.pid} \(not visible from here\)"
        ),
        pytest.raises(NoFreeGpuError),
    ):
        claim(1, tmp_path)


def test_gpus_command_shows_memory_holders_and_claims(
    gpu_env: pytest.MonkeyPatch,
    tmp_path: Path,
    holder: subprocess.Popen[bytes],
    capsys: pytest.CaptureFixture[str],
) -> None:
    nvml = fake_nvml([busy(holder.pid, 8.0, [(float(t), 0) for t in range(21)]), idle()])
    gpu_env.setitem(sys.modules, "pynvml", nvml)
    gpu_env.setenv("MODELBENCH_GPU_LOCK_DIR", str(tmp_path))
    with pytest.warns(GpuWarning), claim(1) as mine:  # modelbench's own claim, on GPU 1
        assert mine.gpus == ("1",)
        assert main(["gpus"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == [
        "GPU",
        "memory",
        "used",
        "/",
        "total",
        "util",
        "held",
        "by",
        "modelbench",
    ]
    assert out[1].startswith("0 ") and f"pid {holder.pid} (user {getpass.getuser()}" in out[1]
    assert "8.0 GiB / 80.0 GiB" in out[1] and " 0% " in out[1]
    assert out[2].startswith("1 ") and "0.3 GiB / 80.0 GiB" in out[2]
    assert f"claimed by pid={os.getpid()}" in out[2]
    assert out[3] == "(from NVML)"
    assert out[4].startswith("GPU 0: 0% utilised over the last 20 s") and "leftover" in out[4]
    assert holder.poll() is None


def test_gpus_command_bad_list_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "--gpus", "0,,x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("modelbench gpus: error: --gpus")


def test_a_gpu_named_with_gpus_is_reported_with_its_holder(
    gpu_env: pytest.MonkeyPatch, tmp_path: Path, holder: subprocess.Popen[bytes]
) -> None:
    nvml = fake_nvml([busy(holder.pid, 21.2, [(0.0, 97)])])
    gpu_env.setitem(sys.modules, "pynvml", nvml)
    with (
        pytest.warns(
            GpuWarning, match=rf"GPU GPU-00000000 is busy: 21.2 GiB held by pid {holder.pid}"
        ),
        pytest.raises(NoFreeGpuError),
    ):
        claim(1, tmp_path, option="GPU-00000000")  # named by UUID (--gpus)
