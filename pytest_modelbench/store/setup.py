"""The setup behind a score: what served the model and how it was asked, as one record.

A :class:`SetupRecord` is gathered where the engine and the endpoint are known
(``evaluation/setup.py``), saved with the item's one record (``result.json``) and with
every baseline ``--update-baselines`` writes, and compared before a verdict: the fields
here are the ones that can change what a model answers (engine and version, output-changing
serving args, GPUs, driver and CUDA, weights, chat template, sampling, token budget, data,
prompt format, modelbench's version). Ports and memory utilisation are never recorded.
A field nobody could know (an endpoint's GPUs) is None and is never compared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

# the parts shown for every setup, in this order; any other differing field is appended
_HEADLINE = ("engine", "gpus", "serve.tensor_parallel_size", "serve.dtype", "serve.quantization")
_SHORT = 12  # hashes are shown (and compared) in full, shown shortened


@dataclass(frozen=True)
class SetupRecord:
    """What produced an item's results, field by field (None: not known, never compared)."""

    engine: str | None = None  # "vllm" (served here), "endpoint" (external), "solutions"
    engine_version: str | None = None  # what the server's /version reported
    serve_args: Mapping[str, Any] | None = None  # serving args that can change outputs
    gpu_model: str | None = None  # NVML's name of the server's GPUs ("NVIDIA H100 80GB HBM3")
    gpu_count: int | None = None  # GPUs of one server (0: CPU)
    driver_version: str | None = None  # NVIDIA driver (NVML)
    cuda_version: str | None = None  # the driver's CUDA version (NVML), "12.4"
    weights: str | None = None  # HF revision, or a digest of a local checkpoint's files
    chat_template: str | None = None  # sha256 of the chat template the server applies
    sampling_args: Mapping[str, Any] | None = None  # what each request sends (not max_tokens)
    max_tokens: int | None = None  # the token budget of each request
    data: str | None = None  # digest of the suite's data and scorer (the backend's fingerprint)
    prompt_format: str | None = None  # "chat" or "completions", and the module building prompts
    modelbench_version: str | None = None
    endpoint_root: str | None = None  # external endpoints: the /v1/models card's root
    system_fingerprint: str | None = None  # external endpoints: responses' system_fingerprint

    SCHEMA_VERSION: ClassVar[int] = 1

    # -- the record on disk ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """JSON form (``result.json`` and baseline files), without the fields nobody knew."""
        data = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        for name in ("serve_args", "sampling_args"):
            if name in data:
                data[name] = dict(data[name])
        return {"schema_version": self.SCHEMA_VERSION, **data}

    @classmethod
    def from_json(cls, data: object) -> SetupRecord | None:
        """The record :meth:`to_json` wrote; None for anything else (another schema, none)."""
        if not isinstance(data, Mapping) or data.get("schema_version") != cls.SCHEMA_VERSION:
            return None
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if values.get("gpu_count") and not values.get("gpu_model"):
            # GPUs NVML never saw: earlier records took ``serve.gpus`` for a model served on
            # the CPU; unknown, so never compared with a record of what was used
            values["gpu_count"] = None
        return cls(**values)

    # -- comparing ------------------------------------------------------------------------------
    def parts(self) -> dict[str, Any]:
        """The comparable values by dotted name (``serve.dtype``, ``sampling.temperature``);
        a mapping field nobody knew contributes nothing."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("serve_args", "sampling_args"):
                if value is not None:
                    prefix = "serve" if f.name == "serve_args" else "sampling"
                    out.update({f"{prefix}.{k}": v for k, v in value.items()})
                    out[f"{prefix}."] = True  # known, even when empty
            elif value is not None:
                out[f.name] = value
        return out

    def differences(self, other: SetupRecord) -> list[str]:
        """Dotted names of the fields that differ and that both records know, in field order;
        modelbench's own version is recorded, never compared (every upgrade would differ, and
        the data and prompt format fields already change with what it sends)."""
        mine, theirs = self.parts(), other.parts()
        mine.pop("modelbench_version", None)
        theirs.pop("modelbench_version", None)
        names = [*mine, *(k for k in theirs if k not in mine)]
        out = []
        for name in names:
            prefix = name.split(".", 1)[0] + "." if "." in name else None
            if prefix is not None:
                if name == prefix or prefix not in mine or prefix not in theirs:
                    continue
            elif name not in mine or name not in theirs:
                continue
            if mine.get(name) != theirs.get(name):
                out.append(name)
        return out

    def describe(self, extra: tuple[str, ...] = ()) -> str:
        """``vllm 0.32.0, 1×H100, TP2, bf16, max_tokens 512`` plus the ``extra`` fields
        (``temperature 0.7``): the setup in one short phrase."""
        parts = self.parts()
        shown: list[str] = []
        engine = " ".join(str(v) for v in (self.engine, self.engine_version) if v)
        if engine:
            shown.append(engine)
        if self.gpu_count is not None:
            shown.append(
                f"{self.gpu_count}×{_gpu_name(self.gpu_model)}" if self.gpu_count else "CPU"
            )
        tp = parts.get("serve.tensor_parallel_size")
        if isinstance(tp, int) and tp > 1:
            shown.append(f"TP{tp}")
        for name in ("serve.dtype", "serve.quantization"):
            if parts.get(name) is not None:
                shown.append(str(parts[name]))
        if self.max_tokens is not None or "max_tokens" in extra:
            shown.append(f"max_tokens {_value(self.max_tokens)}")
        for name in extra:
            if name in _HEADLINE or name in ("engine_version", "gpu_model", "gpu_count"):
                continue
            if name == "max_tokens":
                continue
            shown.append(f"{name.split('.', 1)[-1]} {_value(parts.get(name))}")
        return ", ".join(shown) or "setup unknown"


def _gpu_name(name: str | None) -> str:
    """``H100`` for ``NVIDIA H100 80GB HBM3``: the model, not the vendor or memory."""
    if not name:
        return "GPU"
    words = [w for w in name.split() if w.upper() not in ("NVIDIA", "GEFORCE", "TESLA")]
    return words[0] if words else name


def _value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, str) and len(value) > 2 * _SHORT and " " not in value:
        return value[:_SHORT]  # a digest
    return str(value)


@dataclass(frozen=True)
class SetupComparison:
    """How this run's setup differs from its baseline's: the fields and the one line."""

    fields: tuple[str, ...] = ()
    line: str = ""  # "setup differs (...): baseline: ...; this run: ..."; "" when none


def compare_setups(
    current: SetupRecord | None,
    baseline: SetupRecord | None,
    labels: tuple[str, str] = ("baseline", "this run"),
) -> SetupComparison:
    """The differences that can change outputs between a baseline's setup and this run's; none
    when either is unknown (a baseline written before setups were recorded). ``labels`` name
    the two sides in the line (``("A", "B")`` for ``modelbench compare``)."""
    if current is None or baseline is None:
        return SetupComparison()
    fields = tuple(current.differences(baseline))
    if not fields:
        return SetupComparison()
    names = ", ".join(f.removesuffix(".") for f in fields)
    return SetupComparison(
        fields,
        f"setup differs ({names}): {labels[0]}: {baseline.describe(fields)}; "
        f"{labels[1]}: {current.describe(fields)}",
    )
