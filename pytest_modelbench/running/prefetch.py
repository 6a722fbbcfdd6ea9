"""Import what session end will need while an item waits on its server.

Writing ``results.parquet`` at session end imports pyarrow (about 0.35 s), after the last
request, where the user waits for it. An item that sends requests spends most of its time
waiting on the server, so the import is started then, in a background thread: by session end
it is done. Items read from the store never start it (their reports may need no pyarrow).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Sequence

__all__ = ["SESSION_END_MODULES", "prefetch"]

SESSION_END_MODULES = ("pyarrow", "pyarrow.json", "pyarrow.parquet")
_started: set[str] = set()
_lock = threading.Lock()


def _load(modules: Sequence[str]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # missing or broken: session end says so itself
            continue


def prefetch(modules: Sequence[str] = SESSION_END_MODULES) -> None:
    """Import ``modules`` in a daemon thread, once per process; never raises."""
    with _lock:
        todo = [m for m in modules if m not in _started]
        _started.update(todo)
    if todo:
        threading.Thread(
            target=_load, args=(todo,), name="modelbench-prefetch", daemon=True
        ).start()
