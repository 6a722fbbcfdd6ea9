"""Inference serving: GPU claims, engine servers (vLLM, SGLang, any command) and the built-in
smoke model.

Standard library only at import time; vLLM runs in its own process and ``tokenizers`` is
imported only when the smoke model is built.
"""

from __future__ import annotations

from pytest_modelbench.serving.base import (
    Engine,
    EngineNotInstalledError,
    LaunchSpec,
    ServerHandle,
    ServerStartError,
    ServingError,
)
from pytest_modelbench.serving.engines import ENGINES, engine_for
from pytest_modelbench.serving.gpu_claims import GpuClaim, NoFreeGpuError, claim
from pytest_modelbench.serving.gpu_discovery import GpuWarning, discover_gpus
from pytest_modelbench.serving.gpus import auto_num_workers
from pytest_modelbench.serving.smoke import SMOKE_MODEL_NAME, build_smoke_model
from pytest_modelbench.serving.vllm import VllmEngine, VllmServer

__all__ = [
    "ENGINES",
    "SMOKE_MODEL_NAME",
    "Engine",
    "EngineNotInstalledError",
    "GpuClaim",
    "GpuWarning",
    "LaunchSpec",
    "NoFreeGpuError",
    "ServerHandle",
    "ServerStartError",
    "ServingError",
    "VllmEngine",
    "VllmServer",
    "auto_num_workers",
    "build_smoke_model",
    "claim",
    "discover_gpus",
    "engine_for",
]
