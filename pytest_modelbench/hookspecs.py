"""Extension points of pytest-modelbench (``pytest_modelbench_*`` hooks).

Defaults are implemented as ``trylast`` hooks in the plugin, so a user's
conftest or another plugin can take over, as pytest-xdist does for
``pytest_xdist_make_scheduler``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_modelbench.backends.protocol import Backend
    from pytest_modelbench.store.result import EvalResult


@pytest.hookspec(firstresult=True)
def pytest_modelbench_make_backend(config: pytest.Config, module: str) -> Backend | None:
    """Return the backend that evaluates variants whose ``module`` is ``module``, or None.
    A backend written against :mod:`pytest_modelbench.api` keeps working across releases
    (docs/api.md works one through)."""


def pytest_modelbench_item_finished(
    config: pytest.Config, item_id: str, summary: Mapping[str, Any], result: EvalResult
) -> None:
    """Called once per item that has a result (computed now or read back from the run store),
    once its verdict is final, on the controller: the only process, or the xdist controller for
    items of every worker. ``result`` is the record the item's worker saved (``result.json``),
    ``summary`` its ``summary.json``, ``result.verdict`` the gate's decision. Under
    ``--mb-correction holm`` an item that waits for the other items' p-values is announced
    when Holm's final step settles it, with its final verdict. Items that failed before they had a
    result (a dead server, a usage error) are not announced. The experiment trackers
    (``--mb-tracker``) are implementations of this hook."""
