"""``max_concurrent`` far above an item's work (issue 43): the lanes never outnumber the units
left, so a huge value costs nothing, and a value no engine can serve is one line before
anything runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import Project, one_usage_error, with_qa

# run in a child whose address space is capped 400 MB above what it has mapped once imported:
# one lane per max_concurrent (a task, a coroutine and a frame each) needs gigabytes
BOUNDED = textwrap.dedent(
    """
    import asyncio, resource

    from pytest_modelbench.running.runner import run_lanes

    mapped = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize"))
                 .split()[1]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mapped + 400 * 2**20, resource.RLIM_INFINITY))

    async def main() -> None:
        done = []
        peak = 0

        async def one(example, rollout):
            nonlocal peak
            peak = max(peak, len(asyncio.all_tasks()) - 1)  # less main()
            await asyncio.sleep(0)
            done.append(example)

        await run_lanes(iter([(i, 0) for i in range(20)]), one, lambda: 10**9, lambda: False)
        print(len(done), peak)

    asyncio.run(main())
    """
)


def test_a_huge_max_concurrent_runs_a_small_item_in_bounded_memory() -> None:
    result = subprocess.run(
        [sys.executable, "-c", BOUNDED], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    done, peak = map(int, result.stdout.split())
    assert done == 20  # every unit once
    assert 1 < peak <= 20  # concurrent, and never more lanes than units


@pytest.mark.parametrize("value", [100_001, 10**9])
def test_a_max_concurrent_no_engine_serves_is_refused(project: Project, value: int) -> None:
    base = with_qa(project)
    base.models(
        {"alpha": {"model": "m", "api_base_url": "http://127.0.0.1:9/v1", "max_concurrent": value}}
    )
    line = one_usage_error(base, "--model", "alpha", "--collect-only")
    assert line == (
        "ERROR: configs/models.yaml: models.alpha.max_concurrent: at most 100000 requests in "
        "flight (no engine batches more; vLLM's max_num_seqs is 256-1024) "
        f"(got {value})"
    )


def test_the_largest_max_concurrent_is_accepted(base: Project) -> None:
    base.models(
        {
            "alpha": {
                "model": "m",
                "api_base_url": "http://127.0.0.1:9/v1",
                "max_concurrent": 100_000,
            }
        }
    )
    result = base.pytester.runpytest("benchmarks/", "--model", "alpha", "--collect-only")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()


def test_the_flag_is_refused_past_the_same_line(base: Project) -> None:
    line = one_usage_error(
        base, "--model", "alpha", "--mb-max-concurrent", "100001", "--collect-only"
    )
    assert line == "ERROR: --max-concurrent: must be at most 100000, got '100001'"
