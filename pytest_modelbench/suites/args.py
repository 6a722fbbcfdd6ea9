"""Declared env args of the built-in suites, validated with messages that name the fix.

A suite lists its :class:`Arg` specs; :func:`parse_env_args` turns the user's
``env_args`` mapping into a complete, typed dict or raises
:class:`~pytest_modelbench.suites.contract.SuiteArgumentError` naming the arg, the bad
value and what is accepted (with a did-you-mean suggestion).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pytest_modelbench.suites.contract import SuiteArgumentError

Kind = Literal["int", "bool", "str", "str_list", "int_list"]
TRUE = {"true", "yes", "on", "1"}
FALSE = {"false", "no", "off", "0"}


def did_you_mean(value: str, candidates: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` when a candidate is close, else ``""``."""
    close = difflib.get_close_matches(value, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass(frozen=True)
class Arg:
    """One env arg: its type, default, and allowed values.

    ``normalise`` maps list items to their canonical form before checking
    ``choices`` (e.g. ``"High School Biology" -> "high_school_biology"``).
    """

    name: str
    kind: Kind
    default: Any
    help: str
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] | None = None
    normalise: Callable[[str], str] | None = None
    nullable: bool = False

    def accepted(self) -> str:
        if self.kind == "bool":
            return "true or false"
        if self.kind in ("int", "int_list"):
            low = "" if self.minimum is None else f" from {self.minimum}"
            high = "" if self.maximum is None else f" to {self.maximum}"
            noun = "an integer" if self.kind == "int" else "a list of integers"
            return f"{noun}{low}{high}"
        if self.choices:
            shown = ", ".join(self.choices[:12]) + (", ..." if len(self.choices) > 12 else "")
            noun = "one of" if self.kind == "str" else "a list of"
            return f"{noun}: {shown}"
        return "a string" if self.kind == "str" else "a list of strings"


def _fail(suite: str, arg: Arg, value: Any, hint: str = "") -> SuiteArgumentError:
    return SuiteArgumentError(
        f"{suite}: env arg {arg.name!r} got {value!r}{hint}; expected {arg.accepted()}"
    )


def _int(suite: str, arg: Arg, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _fail(suite, arg, value)
    try:
        number = int(value)
    except ValueError:
        raise _fail(suite, arg, value) from None
    if (arg.minimum is not None and number < arg.minimum) or (
        arg.maximum is not None and number > arg.maximum
    ):
        raise _fail(suite, arg, value)
    return number


def _choice(suite: str, arg: Arg, value: Any) -> str:
    if not isinstance(value, str):
        raise _fail(suite, arg, value)
    canonical = arg.normalise(value) if arg.normalise else value
    if arg.choices is not None and canonical not in arg.choices:
        raise _fail(suite, arg, value, did_you_mean(canonical, arg.choices))
    return canonical


def _items(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def convert(suite: str, arg: Arg, value: Any) -> Any:
    """Check and convert one value (``None`` only where the arg is nullable)."""
    if value is None:
        if arg.nullable:
            return None
        raise _fail(suite, arg, value)
    if arg.kind == "int":
        return _int(suite, arg, value)
    if arg.kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, (str, int)) and str(value).strip().lower() in TRUE | FALSE:
            return str(value).strip().lower() in TRUE
        raise _fail(suite, arg, value)
    if arg.kind == "str":
        return _choice(suite, arg, value)
    items = _items(value)
    if not items:
        raise _fail(suite, arg, value)
    if arg.kind == "int_list":
        return tuple(_int(suite, arg, item) for item in items)
    return tuple(dict.fromkeys(_choice(suite, arg, item) for item in items))


def parse_env_args(suite: str, specs: Sequence[Arg], env_args: Mapping[str, Any]) -> dict[str, Any]:
    """Every declared arg, from ``env_args`` or its default; unknown keys are errors."""
    by_name = {spec.name: spec for spec in specs}
    for name in env_args:
        if name not in by_name:
            accepted = ", ".join(sorted(by_name)) or "none"
            raise SuiteArgumentError(
                f"{suite}: unknown env arg {name!r}{did_you_mean(str(name), list(by_name))}; "
                f"accepted: {accepted}"
            )
    return {
        name: convert(suite, spec, env_args[name]) if name in env_args else spec.default
        for name, spec in by_name.items()
    }
