"""Bounds a value must keep wherever it is given (``models.yaml`` or a flag); no imports, so the
options (read at every pytest start-up) and the schema share them without a cycle."""

from __future__ import annotations

MAX_CONCURRENT = 100_000
"""The most requests in flight per item a model may ask for: far above any engine's batch
(vLLM's ``max_num_seqs`` is 256 to 1024), so a larger value is a typo."""
