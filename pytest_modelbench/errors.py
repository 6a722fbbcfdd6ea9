"""User-facing errors: every message names the place, the bad value and the fix."""

from __future__ import annotations

from collections.abc import Iterable


class ModelbenchUsageError(Exception):
    """A user mistake in a config file, option or override.

    The plugin turns it into ``pytest.UsageError`` at configure/collect time,
    or into a one-paragraph item failure at run time. The message is complete
    on its own: file or flag, key, bad value, accepted form.
    """


class EvaluationError(Exception):
    """An item could not be evaluated (endpoint down, error budget exceeded...).

    Raised on the worker; reported as an item error with the message only.
    """


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or an empty string."""
    # lazily: only a mistake needs difflib, not every pytest session's start-up
    import difflib

    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {matches[0]!r}?)" if matches else ""


def one_of(candidates: Iterable[str]) -> str:
    """A readable list of accepted values, truncated when long."""
    names = sorted(candidates)
    shown = ", ".join(names[:12])
    more = f" and {len(names) - 12} more" if len(names) > 12 else ""
    return f"{shown}{more}" if names else "(none configured)"


def is_text(value: str) -> bool:
    """No NUL and no lone surrogate (how Python keeps argv bytes that are not UTF-8)."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown_value(value: object) -> str:
    """A value as messages echo what the user wrote: its repr (``ascii`` for text that
    :func:`is_text` refuses), cut to 60 characters."""
    try:
        text = ascii(value) if isinstance(value, str) and not is_text(value) else repr(value)
    except ValueError:  # an int too large to print
        return f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."
