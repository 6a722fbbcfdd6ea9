"""Whether an item's stored results answer for it now: the reuse decision, in one place.

Order of preference: the finished summary of this run (fingerprint matches)
→ the finished item of the ``--restart`` run (fingerprint matches; files are
linked in) → continue this run's journal → start over. A fingerprint mismatch
or ``--force`` moves the old journal aside and says why. When an external endpoint's
identity cannot be fetched, a finished item recorded at the same URLs still answers
(:func:`stored_unchecked`), marked as not checked.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_modelbench.planning.fingerprint import describe_changes, digest
from pytest_modelbench.store.runstore import ItemState
from pytest_modelbench.store.summary import ItemSummary


class Reuse(enum.Enum):
    STORED = "stored"  # the finished summary answers; nothing is requested
    SEED = "seed"  # nothing stored here yet: try the --restart run, else start fresh
    RESUME = "resume"  # same configuration: continue the journal
    RECOMPUTE = "recompute"  # stale or forced: move the old results aside and start over


@dataclass(frozen=True)
class Decision:
    action: Reuse
    reason: str | None = None  # why stored results are not used (shown to the user)


MISSING_METADATA = "metadata.json is missing, so the earlier results cannot be checked"


def decide(
    *,
    force: bool,
    fingerprint: str,
    parts: Mapping[str, Any],
    state: ItemState,
    num_examples: int | None = None,
    stop_key: str | None = None,
) -> Decision:
    """What to do with an item whose store holds ``state`` (metadata, summary, a journal). A finished
    summary of another ``--num-examples`` is resumed: the journal answers the examples it holds,
    only missing ones are requested, and the summary covers exactly the selected examples."""
    metadata, summary = state.metadata, state.summary
    if force:
        return Decision(Reuse.RECOMPUTE, "--force")
    if metadata is not None and metadata.get("fingerprint") != fingerprint:
        changed = describe_changes(metadata.get("fingerprint_parts", {}), parts)
        return Decision(Reuse.RECOMPUTE, f"configuration changed: {changed}")
    if (
        summary
        and summary.finished
        and summary.fingerprint == fingerprint
        and (summary.num_examples if summary.num_examples is not None else num_examples)
        == num_examples
        and _stop_matches(summary, stop_key)
    ):
        return Decision(Reuse.STORED)
    if metadata is None:
        if state.stored:
            return Decision(Reuse.RECOMPUTE, MISSING_METADATA)
        return Decision(Reuse.SEED)
    return Decision(Reuse.RESUME)


def _stop_matches(summary: ItemSummary, stop_key: str | None) -> bool:
    """A summary of an item stopped early (``--mb-stop-early``) stands only under the same
    rule (baseline, margin, alpha); otherwise the item continues from its journal."""
    stopped = summary.stopped_early
    return not isinstance(stopped, Mapping) or stopped.get("rule_key") == stop_key


def stored_unchecked(
    *,
    force: bool,
    parts: Mapping[str, Any],
    urls: tuple[str, ...],
    state: ItemState,
    num_examples: int | None = None,
    stop_key: str | None = None,
) -> bool:
    """Whether a finished item answers although its endpoint's identity could not be fetched:
    its recorded ``fingerprint_parts`` equal ``parts`` (which lack the identity) but for what the
    endpoint said, recorded at these same ``urls``. Re-reporting needs no network; another URL
    is never taken on trust."""
    metadata = state.metadata
    if force or metadata is None or state.summary is None:
        return False
    recorded = (metadata.get("fingerprint_parts") or {}).get("endpoint")
    if not isinstance(recorded, Mapping) or recorded.get("urls") != list(urls):
        return False
    fingerprint = digest({**parts, "endpoint": recorded})
    decision = decide(
        force=False,
        fingerprint=fingerprint,
        parts=parts,
        state=dataclasses.replace(state, journal=True),
        num_examples=num_examples,
        stop_key=stop_key,
    )
    return decision.action is Reuse.STORED


def seedable(
    fingerprint: str,
    parts: Mapping[str, Any],
    state: ItemState,
    source: str,
    stop_key: str | None = None,
) -> tuple[bool, str | None]:
    """Whether a ``--restart`` run's item (its ``state``) can be taken as is: (True, None);
    (False, why) when it is stale; (False, None) when it never finished (or lost its
    journal)."""
    summary, metadata = state.summary, state.metadata
    if not summary or not summary.finished:
        return False, None
    if not _stop_matches(summary, stop_key):
        return False, f"not reused from {source}: it stopped early under another stop rule"
    if summary.fingerprint != fingerprint or (metadata or {}).get("fingerprint") != fingerprint:
        changed = describe_changes((metadata or {}).get("fingerprint_parts", {}), parts)
        return False, f"not reused from {source}: configuration changed: {changed}"
    return (True, None) if state.journal else (False, None)
