"""Test helpers shipped with pytest-modelbench: a simulated OpenAI-compatible server.

Use :class:`SimServer` for fast load, latency and fault-injection tests of any
OpenAI client (ours or yours), or the ``mb_sim_server`` pytest fixture. Names
are imported lazily so that loading the fixtures plugin does not import aiohttp.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_modelbench.testing.faults import Faults, Latency
    from pytest_modelbench.testing.policy import (
        AnswerPolicy,
        is_correct,
        load_lookup,
        lookup_from_examples,
    )
    from pytest_modelbench.testing.reqlog import RequestLog, RequestRecord, read_log
    from pytest_modelbench.testing.simconfig import SimConfig
    from pytest_modelbench.testing.simserver import SimServer

_EXPORTS = {
    "AnswerPolicy": "policy",
    "Faults": "faults",
    "Latency": "faults",
    "RequestLog": "reqlog",
    "RequestRecord": "reqlog",
    "SimConfig": "simconfig",
    "SimServer": "simserver",
    "is_correct": "policy",
    "load_lookup": "policy",
    "lookup_from_examples": "policy",
    "read_log": "reqlog",
}

__all__ = [
    "AnswerPolicy",
    "Faults",
    "Latency",
    "RequestLog",
    "RequestRecord",
    "SimConfig",
    "SimServer",
    "is_correct",
    "load_lookup",
    "lookup_from_examples",
    "read_log",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
