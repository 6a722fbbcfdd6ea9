"""The engines ``serve.engine`` names, and the model builders (``--model smoke``, ``smollm2``).

Adding an engine is a module with a class that follows :class:`~pytest_modelbench.serving.base.Engine`
and one line in :data:`ENGINES`; nothing else starts a server (``serving/pool.py`` asks
:func:`engine_for`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_modelbench.errors import ModelbenchUsageError, did_you_mean, one_of
from pytest_modelbench.planning.plan import SMOKE, SMOLLM2
from pytest_modelbench.serving.base import Engine
from pytest_modelbench.serving.command import CommandEngine
from pytest_modelbench.serving.sglang import SglangEngine
from pytest_modelbench.serving.smoke import SMOKE_SERVE_ARGS, build_smoke_model
from pytest_modelbench.serving.smollm2 import (
    SMOLLM2_SERVE_ARGS,
    SmolLM2NotInstalledError,
    build_smollm2_model,
)
from pytest_modelbench.serving.vllm import VllmEngine

if TYPE_CHECKING:
    from pytest_modelbench.config.schema import ServeSpec

__all__ = ["ENGINES", "MODEL_BUILDERS", "ModelBuilder", "engine_for"]

ENGINES: dict[str, Engine] = {
    engine.name: engine for engine in (VllmEngine(), SglangEngine(), CommandEngine())
}
DEFAULT_ENGINE = "vllm"


def engine_for(serve: ServeSpec | None) -> Engine:
    """The engine of a ``serve`` section (vLLM without one), its settings checked; ValueError
    with the key, the value and the known engines (or the engine's own fix) otherwise."""
    if serve is None:
        return ENGINES[DEFAULT_ENGINE]
    engine = ENGINES.get(serve.engine)
    if engine is None:
        raise ValueError(
            f"serve.engine: unknown engine {serve.engine!r}{did_you_mean(serve.engine, ENGINES)}; "
            f"known engines: {one_of(ENGINES)}"
        )
    engine.check(serve)
    return engine


@dataclass(frozen=True)
class ModelBuilder:
    """A model modelbench builds itself (``--model smoke``): where it is, built on first use,
    and the ``serve.args`` each engine serves it with (``serve.args`` of the entry win)."""

    build: Callable[[Path], Path]  # cache dir -> the model's directory
    serve_args: Mapping[str, Mapping[str, object]]  # engine name -> its default args


def _smollm2(cache_dir: Path) -> Path:
    try:
        return build_smollm2_model(cache_dir)
    except SmolLM2NotInstalledError as exc:
        raise ModelbenchUsageError(f"--model {SMOLLM2}: {exc}") from None


MODEL_BUILDERS: Mapping[str, ModelBuilder] = {
    SMOKE: ModelBuilder(build_smoke_model, {"vllm": SMOKE_SERVE_ARGS}),
    SMOLLM2: ModelBuilder(_smollm2, {"vllm": SMOLLM2_SERVE_ARGS}),
}
