"""Turn an item's journal rows into ``summary.json`` metrics with uncertainty."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_modelbench.errors import EvaluationError, shown_value
from pytest_modelbench.gating import stats
from pytest_modelbench.store.journal import row_key
from pytest_modelbench.store.summary import ItemSummary


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value


def _number(row: Mapping[str, Any], name: str, value: Any) -> float:
    """A journal row's metric value as a float, or the item's one error line saying which row."""
    try:
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            return float(value)
    except ValueError:
        pass
    raise EvaluationError(
        f"results.jsonl: example {str(row.get('example_id'))!r} (rollout "
        f"{row.get('rollout', 0)}): metric {name!r} is {shown_value(value)}, not a number; "
        "the journal was edited or written by another tool: delete that line to evaluate "
        "the example again"
    )


def metric_summary(values_by_example: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """Value, stderr and 95% CI of one metric (Wilson for 0/1, cluster-robust across rollouts)."""
    values = [v for vs in values_by_example.values() for v in vs]
    if not values:
        return {"value": None, "stderr": None, "ci_low": None, "ci_high": None, "n": 0}
    clusters = [key for key, vs in values_by_example.items() for _ in vs]
    est = stats.summarize_scores(values, clusters)
    return {
        "value": est.value,
        "stderr": _finite(est.stderr),
        "ci_low": _finite(est.ci_low),
        "ci_high": _finite(est.ci_high),
        "n": len(values),
        "examples": len(values_by_example),
        "ci_method": est.method,
    }


def summarise_rows(
    rows: Iterable[Mapping[str, Any]], metric_names: Sequence[str], expected_units: int
) -> ItemSummary:
    """The summary of journal rows (the last row per example/rollout), read once, so
    ``rows`` can stream from the journal (a row is not kept after it is counted).

    The (example, rollout) keys summarised are its ``selected`` (not written in it): the gate and
    :meth:`EvalResult.rows` read exactly those, whatever else the journal holds.
    ``truncated`` counts scored replies that ran out of tokens (``finish_reason: length``);
    ``truncated_in_reasoning`` those of them with no answer yet (still thinking).
    ``empty_answers`` counts replies that ended (``stop``) with no answer, ``answers_in_reasoning``
    those of them with thinking (a reasoning parser that put the answer there), and
    ``reasoning_replies`` the replies that came with thinking (the model reasons)."""
    by_metric: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    n_rows = errors = 0
    prompt_tokens = completion_tokens = reasoning_tokens = 0
    reasoning_reported = False
    truncated = truncated_in_reasoning = 0
    empty_answers = answers_in_reasoning = reasoning_replies = 0
    latency: list[float] = []
    retries = 0
    selected: list[tuple[str, int]] = []
    fingerprints: set[str] = set()  # the endpoint's system_fingerprint (the setup record)
    for row in rows:
        n_rows += 1
        selected.append(row_key(row))
        if row.get("system_fingerprint"):
            fingerprints.add(str(row["system_fingerprint"]))
        retries += max(0, int(row.get("attempts") or 1) - 1)
        if row.get("error"):
            errors += 1
            continue
        for name, value in (row.get("metrics") or {}).items():
            by_metric[name][str(row["example_id"])].append(_number(row, name, value))
        tokens = row.get("tokens") or {}
        prompt_tokens += tokens.get("prompt") or 0
        completion_tokens += tokens.get("completion") or 0
        if row.get("reasoning_tokens") is not None:
            reasoning_reported = True
            reasoning_tokens += int(row["reasoning_tokens"])
        answered = bool(str(row.get("completion") or "").strip())
        thought = bool(str(row.get("reasoning") or "").strip()) or bool(row.get("reasoning_tokens"))
        reasoning_replies += thought
        if row.get("finish_reason") == "length":
            truncated += 1
            truncated_in_reasoning += not answered
        elif not answered and row.get("finish_reason") == "stop":
            # a reply that ended with nothing (stored completions and log-likelihoods have no
            # finish_reason: they are not counted)
            empty_answers += 1
            answers_in_reasoning += thought
        if row.get("latency_s") is not None:
            latency.append(float(row["latency_s"]))
    names = list(dict.fromkeys([*metric_names, *by_metric]))
    metrics = {name: metric_summary(by_metric.get(name, {})) for name in names}
    latency.sort()
    token_counts = {"prompt": prompt_tokens, "completion": completion_tokens}
    if reasoning_reported:
        token_counts["reasoning"] = reasoning_tokens
    extra = {"system_fingerprints": sorted(fingerprints)} if fingerprints else {}
    summary = {
        **extra,
        "metrics": metrics,
        "n_rows": n_rows,
        "n_scored": n_rows - errors,
        "expected": expected_units,
        "errors": errors,
        "error_rate": errors / expected_units if expected_units else 0.0,
        "retries": retries,
        "truncated": truncated,
        "truncated_in_reasoning": truncated_in_reasoning,
        "empty_answers": empty_answers,
        "answers_in_reasoning": answers_in_reasoning,
        "reasoning_replies": reasoning_replies,
        "tokens": token_counts,
        "latency_s": {
            "mean": sum(latency) / len(latency) if latency else None,
            "p50": latency[len(latency) // 2] if latency else None,
            "p95": latency[int(len(latency) * 0.95)] if latency else None,
        },
    }
    return dataclasses.replace(ItemSummary.from_json(summary), selected=tuple(selected))
