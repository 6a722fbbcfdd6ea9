"""Configuration files: models.yaml, envs/*.yaml, baselines/*.yaml, job-*.yaml.

Each file type has a pydantic schema (``schema.py``); ``loading.py`` reads YAML
safely and turns validation errors into one-line messages naming file, key,
value and fix; ``variants.py`` expands matrix sweeps into variants. Names are
imported on first use: every pytest session loads ``config.options``, and
importing this package must not load the schema (pydantic).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_modelbench.config.loading import ConfigSet, load_config_set, load_job_file
    from pytest_modelbench.config.schema import (
        BaselineFile,
        EnvVariantSpec,
        JobFile,
        ModelSpec,
        ServeSpec,
    )
    from pytest_modelbench.config.variants import Variant, expand_variants

_EXPORTS = {
    "BaselineFile": "schema",
    "ConfigSet": "loading",
    "EnvVariantSpec": "schema",
    "JobFile": "schema",
    "ModelSpec": "schema",
    "ServeSpec": "schema",
    "Variant": "variants",
    "expand_variants": "variants",
    "load_config_set": "loading",
    "load_job_file": "loading",
}

__all__ = [
    "BaselineFile",
    "ConfigSet",
    "EnvVariantSpec",
    "JobFile",
    "ModelSpec",
    "ServeSpec",
    "Variant",
    "expand_variants",
    "load_config_set",
    "load_job_file",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # lazily: the schema (pydantic) loads when a name is first used (pytest start-up)
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
