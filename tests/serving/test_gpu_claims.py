"""GPU discovery (provider chain), busy/visibility rules, and host-local claims."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from pytest_modelbench.serving.base import ServingError
from pytest_modelbench.serving.gpu_claims import NoFreeGpuError, claim, tensor_parallel_warning
from pytest_modelbench.serving.gpu_discovery import (
    FAKE_ENV,
    FakeGpuProvider,
    Gpu,
    GpuDiscoveryError,
    GpuWarning,
    NvidiaSmiProvider,
    discover_gpus,
)
from pytest_modelbench.serving.gpus import GpuSpecError, auto_num_workers, parse_gpu_list

FOUR = "0:0,1:0,2:0,3:0"


def test_parse_gpu_list_forms() -> None:
    assert parse_gpu_list("0,1, 3", "--gpus") == ["0", "1", "3"]
    assert parse_gpu_list("1,1,0", "--gpus") == ["1", "0"]
    assert parse_gpu_list("GPU-8a1b-22", "x") == ["GPU-8a1b-22"]
    for nothing in ("", "none", "-1", "cpu"):
        assert parse_gpu_list(nothing, "x") == []
    with pytest.raises(GpuSpecError, match=r"--gpus='0,x'.*'x' is not a GPU index"):
        parse_gpu_list("0,x", "--gpus")


def test_fake_provider_spec_and_busy_gpu_skipped(
    gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gpu_env.setenv(FAKE_ENV, "0:0,1:0,2:30000")
    inventory = discover_gpus()
    assert inventory.source == "fake"
    assert inventory.ids == ("0", "1", "2")
    first = claim(1, tmp_path)
    second = claim(1, tmp_path)
    assert {first.gpus, second.gpus} == {("0",), ("1",)}
    with (
        pytest.warns(GpuWarning, match=r"GPU 2 is busy: 30000 MiB"),
        pytest.raises(NoFreeGpuError, match=r"busy \(> 1024 MiB in use\): 2"),
    ):
        claim(1, tmp_path)
    first.release()
    second.release()


def test_busy_threshold_from_env(gpu_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gpu_env.setenv(FAKE_ENV, "0:30000")
    gpu_env.setenv("MODELBENCH_GPU_BUSY_MIB", "40000")
    with claim(1, tmp_path) as got:
        assert got.gpus == ("0",)


def test_caller_visible_devices_respected(gpu_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gpu_env.setenv(FAKE_ENV, "0:0,1:0,2:0,3:0")
    gpu_env.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    inventory = discover_gpus()
    assert inventory.source == "CUDA_VISIBLE_DEVICES"
    assert inventory.ids == ("2", "3")
    assert all(g.memory_used_mib == 0 for g in inventory.gpus)  # usage merged from the probe
    claims = [claim(1, tmp_path), claim(1, tmp_path)]
    assert sorted(c.gpus[0] for c in claims) == ["2", "3"]
    with pytest.raises(NoFreeGpuError, match="claimed by other modelbench"):
        claim(1, tmp_path)
    for c in claims:
        c.release()


def test_gpus_option_never_leaves_visible_devices(gpu_env: pytest.MonkeyPatch) -> None:
    gpu_env.setenv(FAKE_ENV, FOUR)
    gpu_env.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with pytest.warns(GpuWarning, match=r"GPU\(s\) 0 from --gpus are outside .*=2,3; not used"):
        inventory = discover_gpus("0,2")
    assert inventory.ids == ("2",)
    assert inventory.source == "--gpus"


def test_gpus_option_wins_and_none_means_cpu(gpu_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gpu_env.setenv(FAKE_ENV, FOUR)
    assert discover_gpus("3,1").ids == ("3", "1")
    cpu = claim(1, tmp_path, option="none")
    assert cpu.cpu and cpu.gpus == () and cpu.cuda_visible_devices == ""
    with pytest.raises(GpuSpecError):
        discover_gpus("0;1")


def test_empty_visible_devices_means_no_gpu(gpu_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gpu_env.setenv(FAKE_ENV, FOUR)
    gpu_env.setenv("CUDA_VISIBLE_DEVICES", "")
    assert discover_gpus().ids == ()
    assert claim(1, tmp_path).cpu


def test_malformed_visible_devices_warns_and_is_ignored(
    gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gpu_env.setenv(FAKE_ENV, "0:0,1:0")
    gpu_env.setenv("CUDA_VISIBLE_DEVICES", "0,,banana")
    with pytest.warns(GpuWarning, match="ignoring CUDA_VISIBLE_DEVICES") as record:
        inventory = discover_gpus()
    assert len([w for w in record if "CUDA_VISIBLE_DEVICES" in str(w.message)]) == 1
    assert inventory.source == "fake"
    assert inventory.ids == ("0", "1")


def test_malformed_fake_gpus_warns_and_falls_through(gpu_env: pytest.MonkeyPatch) -> None:
    gpu_env.setenv(FAKE_ENV, "0:lots")
    gpu_env.setenv("PATH", "/nonexistent")  # and no nvidia-smi: the chain ends at "none"
    with pytest.warns(GpuWarning, match=r"MODELBENCH_FAKE_GPUS='0:lots': bad item"):
        inventory = discover_gpus()
    assert inventory.ids == ()
    assert inventory.source == "none"


def test_injected_provider_object(gpu_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    probe = FakeGpuProvider([Gpu("5", 10), Gpu("7", 50_000)])
    assert discover_gpus(probe=probe).ids == ("5", "7")
    with pytest.warns(GpuWarning, match="GPU 7 is busy"):
        assert auto_num_workers(1, tmp_path, probe=probe) == 1


def test_nvidia_smi_provider_and_uuid_visible_devices(
    gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(
        "#!/bin/sh\necho '0, GPU-aaaa, 5'\necho '1, GPU-bbbb, 40000'\necho '2, GPU-cccc, [N/A]'\n"
    )
    smi.chmod(0o755)
    gpu_env.setenv("PATH", str(smi.parent))
    inventory = discover_gpus()
    assert inventory.source == "nvidia-smi"
    assert [(g.id, g.memory_used_mib, g.uuid) for g in inventory.gpus] == [
        ("0", 5, "GPU-aaaa"),
        ("1", 40000, "GPU-bbbb"),
        ("2", None, "GPU-cccc"),
    ]
    gpu_env.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb")
    only = discover_gpus()
    assert only.ids == ("GPU-bbbb",) and only.gpus[0].memory_used_mib == 40000


def test_nvidia_smi_failure_warns() -> None:
    def failing(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 9, "", "NVIDIA-SMI has failed: driver mismatch\n")

    provider = NvidiaSmiProvider(executable=sys.executable, run=failing)
    with pytest.warns(GpuWarning, match="driver mismatch"):
        assert provider.gpus() is None
    with pytest.raises(GpuDiscoveryError, match="cannot read its output line 'garbage'"):
        NvidiaSmiProvider.parse("garbage\n")


def test_same_process_claims_are_disjoint_and_released(
    gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gpu_env.setenv(FAKE_ENV, "0:0,1:0")
    a = claim(1, tmp_path)
    b = claim(1, tmp_path)
    assert a.gpus != b.gpus
    a.release()
    c = claim(1, tmp_path)
    assert c.gpus == a.gpus
    b.release()
    c.release()


def test_tensor_parallel_claims_pairs_and_warns(
    gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gpu_env.setenv(FAKE_ENV, FOUR)
    with pytest.warns(GpuWarning, match="tensor parallel size 2"):
        pair = claim(2, tmp_path)
    with pytest.warns(GpuWarning):
        other = claim(2, tmp_path)
    assert len(pair.gpus) == 2 and len(other.gpus) == 2
    assert not set(pair.gpus) & set(other.gpus)
    assert pair.cuda_visible_devices == ",".join(pair.gpus)
    assert tensor_parallel_warning(1) is None
    pair.release()
    other.release()


def test_auto_num_workers(gpu_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gpu_env.setenv(FAKE_ENV, "0:0,1:0,2:0,3:0,4:0,5:0,6:0,7:50000")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GpuWarning)
        assert auto_num_workers(1, tmp_path) == 7
        assert auto_num_workers(2, tmp_path) == 3
        held = claim(1, tmp_path)  # another session holds one
        assert auto_num_workers(1, tmp_path) == 6
        held.release()
    gpu_env.setenv(FAKE_ENV, "")
    assert auto_num_workers(1, tmp_path) == 1  # no GPU: one worker (CPU serving / endpoints)


CLAIMER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from pytest_modelbench.serving.gpu_claims import NoFreeGpuError, claim
    try:
        got = claim(int(sys.argv[2]), Path(sys.argv[1]))
    except NoFreeGpuError as exc:
        print("NONE", exc, flush=True)
        sys.exit(3)
    print(",".join(got.gpus), flush=True)
    sys.stdin.read()  # hold the claim until the test closes our stdin
    """
)


def _claimer(lock_dir: Path, n: int, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLAIMER, str(lock_dir), str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_concurrent_processes_get_disjoint_gpus(
    gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = {**os.environ, FAKE_ENV: "0:0,1:0,2:0,3:0,4:0,5:0", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    env.pop("MODELBENCH_GPU_BUSY_MIB", None)
    procs = [_claimer(tmp_path, 1, env) for _ in range(5)]  # started together: they race
    lines = [p.stdout.readline().strip() for p in procs if p.stdout is not None]
    got = [line for line in lines if not line.startswith("NONE")]
    assert sorted(got) == ["0", "1", "2", "3"]  # disjoint, and never 4 or 5 (not visible)
    assert sum(line.startswith("NONE") for line in lines) == 1
    for p in procs:
        p.communicate("")
    assert sorted(p.returncode for p in procs) == [0, 0, 0, 0, 3]


def test_concurrent_pairs_and_lock_dropped_on_sigkill(
    gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = {**os.environ, FAKE_ENV: FOUR}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    procs = [_claimer(tmp_path, 2, env) for _ in range(2)]
    pairs = [set(p.stdout.readline().strip().split(",")) for p in procs if p.stdout is not None]
    assert pairs[0] | pairs[1] == {"0", "1", "2", "3"} and not pairs[0] & pairs[1]
    gpu_env.setenv(FAKE_ENV, FOUR)
    with pytest.raises(NoFreeGpuError, match=r"pid=\d+"):  # holder shown in the message
        claim(1, tmp_path)
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()
    with claim(1, tmp_path) as mine:  # the kernel dropped the dead process's locks
        assert mine.gpus[0] in pairs[0]
    procs[1].communicate("")


def test_more_gpus_per_server_than_the_node_has_fails_at_once(
    gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Not a wait for GPUs to come free (a worker without a GPU would wait for the session's
    end): one line with the node's count and the fix, whatever ``wait_s`` allows."""
    gpu_env.setenv(FAKE_ENV, "0:0,1:0")
    with pytest.raises(ServingError, match=r"^serve.gpus is 3, but this node has 2 GPU") as got:
        claim(3, tmp_path, wait_s=600.0)
    assert not isinstance(got.value, NoFreeGpuError)
    assert "set serve.gpus to at most 2" in str(got.value)
