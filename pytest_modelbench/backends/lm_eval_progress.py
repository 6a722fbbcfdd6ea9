"""Live progress for lm-eval items: count requests as lm-eval's API model answers them.

lm-eval has no progress callback, but every API answer passes through the
model's cache hook (``add_partial``), and every batch of requests through one
of three methods. Wrapping those on the model instance gives the request total
(what is not already in lm-eval's cache) and one ``advance`` per answer,
without touching lm-eval's code or its results.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from pytest_modelbench.running.progress import ProgressSink

REQUEST_METHODS = ("generate_until", "loglikelihood", "loglikelihood_rolling")


class _CountingHook:
    """Forwards to lm-eval's cache hook and reports one finished request per answer."""

    def __init__(self, inner: Any, progress: LmEvalProgress) -> None:
        self._inner = inner
        self._progress = progress

    def add_partial(self, attr: str, req: Any, res: Any) -> None:
        self._progress.answered()
        if self._inner is not None:
            self._inner.add_partial(attr, req, res)


class LmEvalProgress:
    """Reports an lm-eval model's requests to a progress sink (thread-safe)."""

    def __init__(self, sink: ProgressSink, item_id: str) -> None:
        self._sink = sink
        self._item_id = item_id
        self._lock = threading.Lock()
        self.total = 0
        self.done = 0

    def attach(self, lm: Any) -> None:
        """Wrap ``lm``'s request methods and cache hook (the instance only, not its class)."""
        for name in REQUEST_METHODS:
            original = getattr(lm, name, None)
            if callable(original):
                setattr(lm, name, self._counted(original))
        set_hook = lm.set_cache_hook

        def set_cache_hook(hook: Any) -> None:
            set_hook(_CountingHook(hook, self))

        lm.set_cache_hook = set_cache_hook
        set_cache_hook(getattr(lm, "cache_hook", None))

    def _counted(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def counted(requests: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.total += len(requests)
                total, done = self.total, self.done
            self._sink.start(self._item_id, total, done)
            return method(requests, *args, **kwargs)

        return counted

    def answered(self) -> None:
        with self._lock:
            if self.done >= self.total:  # an inner call answering for an outer one
                return
            self.done += 1
        self._sink.advance()
