"""A model's endpoint list (``api_base_url: [a, b]``) is honoured by the built-in suites'
backend: requests land on every URL, and with one URL down the others serve. The same is
checked for lm-eval (test_lm_eval.py) and both verifiers lines (test_verifiers*.py), which
reach the list through the worker's loopback router."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import Project, configure

N = 24


@pytest.fixture
def down_url() -> Iterator[str]:
    """A base URL whose port is bound but not listening: every connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def at(project: Project, urls: list[str], **model: Any) -> None:
    """The ``qa`` jsonl environment (N questions) and model ``alpha`` at the URL list."""
    configure(project, urls[0], n=N)
    project.models(
        {"alpha": {"model": "sim-model", "api_base_url": urls, "retry_backoff": 0.01, **model}}
    )


def completions(server: Any) -> int:
    return sum(1 for r in server.requests if r.path.endswith("completions"))


def test_requests_land_on_every_url_of_the_list(project: Project, sim: Any) -> None:
    one, two = (sim(accuracy=1.0, lookup={}, latency=0.01) for _ in range(2))
    at(project, [one.base_url, two.base_url], max_concurrent=4)
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    assert completions(one) + completions(two) == N
    assert completions(one) >= N // 4 and completions(two) >= N // 4


def test_with_the_first_url_down_the_others_serve(
    project: Project, sim: Any, down_url: str
) -> None:
    up = sim(accuracy=1.0, lookup={}, latency=0.001)
    at(project, [down_url, up.base_url], max_concurrent=4, max_retries=0)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(passed=1)
    assert completions(up) == N  # every example answered, none spent a retry on the dead URL
