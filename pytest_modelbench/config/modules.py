"""Names usable as a variant's ``module``: the prefixed backends and the one check of their form.

The backends themselves live in :mod:`pytest_modelbench.backends`; this module
knows only the prefixes and what follows the colon, so config validation,
``--env`` selectors and backend resolution share one check and one message.
"""

from __future__ import annotations

# prefix -> what follows the colon, for messages
PREFIXES: dict[str, str] = {
    "verifiers": "environment id",
    "lm_eval": "task name or task YAML path",
}


def missing_name(module: str) -> str | None:
    """For ``lm_eval:`` / ``verifiers: `` (a known prefix with nothing after the colon): how to
    write it; None for every other module name."""
    prefix, colon, name = module.partition(":")
    what = PREFIXES.get(prefix)
    if not colon or name.strip() or what is None:
        return None
    return f"give the {what} after the colon: '{prefix}:<{what}>'"
