"""GPUs that report oddly (issue 28): nvidia-smi outputs from real machines, read defensively; a
node with GPUs modelbench cannot read is an error naming the line, never a silent CPU run."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_modelbench.serving.gpu_claims import NoFreeGpuError, claim
from pytest_modelbench.serving.gpu_discovery import (
    Gpu,
    GpuDiscoveryError,
    GpuWarning,
    NvidiaSmiProvider,
    NvmlProvider,
    discover_gpus,
)
from pytest_modelbench.serving.gpus import auto_num_workers

DATA = Path(__file__).parent / "data" / "nvidia-smi"
H100 = "GPU-f5c2614b-dd10-01d3-aca1-b616991f60e0"


def smi(name: str, code: int = 0) -> NvidiaSmiProvider:
    """nvidia-smi answering with the fixture ``name``."""
    text = (DATA / name).read_text()

    def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, code, text if code == 0 else "", text)

    return NvidiaSmiProvider(executable=sys.executable, run=run)


def test_idle_h100(gpu_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert smi("h100-idle.txt").gpus() == [Gpu("0", 0, H100)]
    with claim(1, tmp_path, probe=smi("h100-idle.txt")) as claimed:
        assert claimed.gpus == ("0",)


def test_busy_h100_is_skipped(gpu_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert smi("h100-busy.txt").gpus() == [Gpu("0", 4623, H100)]
    with (
        pytest.warns(GpuWarning, match="GPU 0 is busy: 4623 MiB"),
        pytest.raises(NoFreeGpuError, match=r"busy \(> 1024 MiB in use\): 0"),
    ):
        claim(1, tmp_path, probe=smi("h100-busy.txt"))


def test_mig_memory_is_unknown_not_free(gpu_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    probe = smi("a100-mig.txt")
    assert [g.memory_used_mib for g in probe.gpus() or []] == [None, None]
    with (
        pytest.warns(GpuWarning, match="GPU 0 does not report its memory in use"),
        pytest.raises(NoFreeGpuError),
    ):
        claim(1, tmp_path, probe=probe)
    with pytest.warns(GpuWarning, match="does not report its memory"):
        assert auto_num_workers(1, tmp_path, probe=probe) == 1
    with claim(1, tmp_path, option="1", probe=probe) as claimed:  # named by the user: used
        assert claimed.gpus == ("1",)


def test_a_notice_line_is_skipped_not_fatal(gpu_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.warns(GpuWarning, match="line 'WARNING: infoROM is corrupted"):
        assert smi("h100-inforom-warning.txt").gpus() == [Gpu("0", 0, H100)]


def test_unreadable_output_is_an_error_not_the_cpu(
    gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    probe = NvidiaSmiProvider(
        executable=sys.executable,
        run=lambda cmd, **_: subprocess.CompletedProcess(cmd, 0, "GPU 0: NVIDIA H100 (x)\n", ""),
    )
    with pytest.raises(GpuDiscoveryError, match=r"line 'GPU 0: NVIDIA H100 \(x\)'.*--gpus none"):
        claim(1, tmp_path, probe=probe)
    assert claim(1, tmp_path, option="none", probe=probe).cpu  # the user's choice


def test_missing_driver_warns_and_finds_no_gpu(gpu_env: pytest.MonkeyPatch) -> None:
    with pytest.warns(GpuWarning, match="couldn't communicate with the NVIDIA driver"):
        assert smi("no-driver.txt", code=9).gpus() is None


def fake_pynvml(devices: list[tuple[str, int, int]], fail: str = "") -> types.ModuleType:
    """A stand-in for nvidia-ml-py: (uuid, MiB used, MIG mode) per device."""
    module = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def call(name: str, result: Callable[..., object]) -> Callable[..., object]:
        def method(*args: object) -> object:
            if name == fail:
                raise NVMLError(f"{name} failed")
            return result(*args)

        return method

    module.NVMLError = NVMLError  # type: ignore[attr-defined]
    module.nvmlInit = call("nvmlInit", lambda: None)  # type: ignore[attr-defined]
    module.nvmlShutdown = call("nvmlShutdown", lambda: None)  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = call("count", lambda: len(devices))  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = call("handle", lambda i: i)  # type: ignore[attr-defined]
    module.nvmlDeviceGetUUID = call("uuid", lambda h: devices[h][0])  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = call(  # type: ignore[attr-defined]
        "memory", lambda h: types.SimpleNamespace(used=devices[h][1] * 2**20)
    )
    module.nvmlDeviceGetMigMode = call(  # type: ignore[attr-defined]
        "mig", lambda h: [devices[h][2], devices[h][2]]
    )
    return module


def test_nvml_first(monkeypatch: pytest.MonkeyPatch) -> None:
    # the H100 above through NVML: 480 MiB reserved by the driver count as used
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([(H100, 480, 0), ("GPU-mig", 0, 1)]))
    assert NvmlProvider().gpus() == [Gpu("0", 480, H100), Gpu("1", None, "GPU-mig")]


def test_nvml_without_a_driver_defers_to_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], fail="nvmlInit"))
    assert NvmlProvider().gpus() is None


def test_nvml_that_cannot_read_a_gpu_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([(H100, 0, 0)], fail="memory"))
    with pytest.raises(GpuDiscoveryError, match="NVML: cannot read the node's GPUs"):
        NvmlProvider().gpus()


# -- the hardware probe: NVML first, nvidia-smi only when NVML cannot load ------------------


@pytest.fixture
def smi_on_path(gpu_env: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A fake ``nvidia-smi`` first on PATH that answers one GPU and notes each run."""
    runs = tmp_path / "smi-runs"
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\necho run >> {runs}\necho '0, GPU-from-smi, 1234'\n")
    script.chmod(0o755)
    gpu_env.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return runs


def test_the_probe_asks_nvml_and_never_runs_nvidia_smi(
    smi_on_path: Path, gpu_env: pytest.MonkeyPatch
) -> None:
    gpu_env.setitem(sys.modules, "pynvml", fake_pynvml([(H100, 480, 0)]))
    inventory = discover_gpus()
    assert (inventory.source, inventory.gpus) == ("NVML", (Gpu("0", 480, H100),))
    assert not smi_on_path.exists()


@pytest.mark.parametrize("nvml", ["not installed", "no driver"])
def test_nvidia_smi_answers_only_when_nvml_cannot_load(
    smi_on_path: Path, gpu_env: pytest.MonkeyPatch, nvml: str
) -> None:
    module = None if nvml == "not installed" else fake_pynvml([], fail="nvmlInit")
    gpu_env.setitem(sys.modules, "pynvml", module)  # None: the import fails
    inventory = discover_gpus()
    assert (inventory.source, inventory.gpus) == ("nvidia-smi", (Gpu("0", 1234, "GPU-from-smi"),))
    assert smi_on_path.read_text() == "run\n"


def test_fake_gpus_bypass_both_probes(smi_on_path: Path, gpu_env: pytest.MonkeyPatch) -> None:
    gpu_env.setitem(sys.modules, "pynvml", fake_pynvml([(H100, 480, 0)]))
    gpu_env.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:30000")
    inventory = discover_gpus()
    assert (inventory.source, inventory.ids) == ("fake", ("0", "1"))
    assert not smi_on_path.exists()
