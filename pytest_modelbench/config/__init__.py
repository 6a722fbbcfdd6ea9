"""Configuration files: models.yaml, envs/*.yaml, baselines/*.yaml, job-*.yaml.

Each file type has a pydantic schema (``schema.py``); ``loading.py`` reads YAML
safely and turns validation errors into one-line messages naming file, key,
value and fix; ``variants.py`` expands matrix sweeps into variants.
"""

from __future__ import annotations

from pytest_modelbench.config.loading import ConfigSet, load_config_set, load_job_file
from pytest_modelbench.config.schema import (
    BaselineFile,
    EnvVariantSpec,
    JobFile,
    ModelSpec,
    ServeSpec,
)
from pytest_modelbench.config.variants import Variant, expand_variants

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
