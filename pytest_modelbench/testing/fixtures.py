"""pytest fixtures for the simulated OpenAI-compatible server (loaded via the pytest11 entry point).

aiohttp is imported only when a test asks for a server, so loading this
plugin costs nothing for sessions that never use it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import pytest

if TYPE_CHECKING:
    from pytest_modelbench.testing.simconfig import SimConfig
    from pytest_modelbench.testing.simserver import SimServer


class SimServerFactory(Protocol):
    """Starts a :class:`SimServer` from a :class:`SimConfig` and/or its fields as kwargs."""

    def __call__(self, config: SimConfig | None = None, /, **fields: Any) -> SimServer: ...


@pytest.fixture
def mb_sim_server() -> Iterator[SimServerFactory]:
    """Start simulated OpenAI-compatible servers for this test; all stop at teardown.

    Call it with a :class:`~pytest_modelbench.testing.SimConfig` or its fields
    (``latency`` may be a number of seconds, ``faults`` a dict of
    :class:`~pytest_modelbench.testing.Faults` fields)::

        def test_client_retries(mb_sim_server):
            srv = mb_sim_server(slots=8, latency=0.01, faults={"error_5xx": 0.1})
            results = my_client.run(base_url=srv.base_url, model="sim-model")
            assert srv.counts["5xx"] > 0
            assert max(srv.answers_per_key().values()) == 1  # nothing answered twice
    """
    # lazily: the simulated server loads only when a test asks for it (pytest start-up)
    from pytest_modelbench.testing.simconfig import SimConfig
    from pytest_modelbench.testing.simserver import SimServer

    started: list[SimServer] = []

    def factory(config: SimConfig | None = None, /, **fields: Any) -> SimServer:
        unknown = set(fields) - set(SimConfig.field_names())
        if unknown:
            raise TypeError(
                f"mb_sim_server: unknown SimConfig field(s) {sorted(unknown)}; "
                f"accepted: {', '.join(SimConfig.field_names())}"
            )
        server = SimServer(config, **fields)
        started.append(server)
        return server.start()

    yield factory
    for server in reversed(started):
        server.stop()
