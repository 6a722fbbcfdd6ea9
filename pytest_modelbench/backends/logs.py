"""Keeping the optional backends' chatty library loggers quiet while they run."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_logger(name: str) -> Iterator[None]:
    """Keep a chatty library logger (lm-eval, verifiers log every batch at INFO) at WARNING while it runs."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)
