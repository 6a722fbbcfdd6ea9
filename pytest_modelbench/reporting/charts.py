"""Inline SVG charts (no JavaScript, no external files, so they survive ``--self-contained-html``).

:func:`score_chart`: per environment variant, one bar per model with its 95%
CI whisker and the baseline as a black tick. :func:`checkpoint_chart`: score
vs training step for checkpoint sweeps (``<name>-step<N>`` models), one line
per variant with CI whiskers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

# Okabe-Ito: distinguishable with the common colour-vision deficiencies
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
_FONT = 'font-family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif"'


@dataclass(frozen=True)
class Point:
    """One score with its interval; ``label`` names it in the hover text."""

    group: str  # x category (variant) or series (variant, for checkpoint lines)
    key: str  # model (bars) or "" (lines)
    value: float
    low: float | None = None
    high: float | None = None
    baseline: float | None = None
    step: int = 0
    label: str = ""


def _nice_range(values: Sequence[float]) -> tuple[float, float]:
    """0..1 for proportions, otherwise a padded range with round ends."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    lo, hi = min(finite), max(finite)
    if lo >= 0.0 and hi <= 1.0:
        return 0.0, 1.0
    lo = min(lo, 0.0)
    span = hi - lo or 1.0
    step = 10 ** math.floor(math.log10(span))
    return math.floor(lo / step) * step, math.ceil(hi / step) * step


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    return [lo + (hi - lo) * i / count for i in range(count + 1)]


def _fmt(value: float) -> str:
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.0f}"


def _svg_open(width: int, height: int, kind: str, title: str) -> list[str]:
    return [
        f'<svg class="mb-chart" data-chart="{kind}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}" {_FONT} font-size="12">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{width / 2:.0f}" y="18" text-anchor="middle" font-size="14" '
        f'font-weight="600">{escape(title)}</text>',
    ]


def _y_axis(
    out: list[str], lo: float, hi: float, left: int, top: int, plot_w: int, plot_h: int, label: str
) -> None:
    for tick in _ticks(lo, hi):
        y = top + plot_h - (tick - lo) / (hi - lo) * plot_h
        out.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
        )
        out.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#444">'
            f"{_fmt(tick)}</text>"
        )
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}" stroke="#888"/>')
    out.append(
        f'<text transform="translate(14,{top + plot_h / 2:.0f}) rotate(-90)" '
        f'text-anchor="middle" fill="#444">{escape(label)}</text>'
    )


def _legend(out: list[str], names: Sequence[str], x: int, y: int, width: int) -> int:
    """Legend entries wrapped to ``width``; returns the height used."""
    cx, cy = x, y
    for i, name in enumerate(names):
        text_w = 7 * len(name) + 26
        if cx + text_w > x + width and cx > x:
            cx, cy = x, cy + 18
        out.append(
            f'<rect x="{cx}" y="{cy - 9}" width="12" height="12" '
            f'fill="{PALETTE[i % len(PALETTE)]}"/>'
        )
        out.append(f'<text x="{cx + 16}" y="{cy + 1}" fill="#222">{escape(name)}</text>')
        cx += text_w
    return cy - y + 18


def _whisker(out: list[str], x: float, y_low: float, y_high: float, half: float) -> None:
    out.append(
        f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y_low:.1f}" y2="{y_high:.1f}" '
        f'stroke="#222" stroke-width="1.2" class="mb-whisker"/>'
    )
    for y in (y_low, y_high):
        out.append(
            f'<line x1="{x - half:.1f}" x2="{x + half:.1f}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="#222" stroke-width="1.2"/>'
        )


def score_chart(
    points: Sequence[Point],
    metric_label: str = "score",
    title: str = "Scores by environment and model",
) -> str:
    """Grouped bars: x = variant, one bar per model, CI whiskers, baseline ticks."""
    groups = list(dict.fromkeys(p.group for p in points))
    models = list(dict.fromkeys(p.key for p in points))
    by_key = {(p.group, p.key): p for p in points}
    bar_w = max(8, min(36, 320 // max(1, len(models))))
    group_w = bar_w * len(models) + 24
    left, right, top = 56, 16, 34
    plot_w = max(360, group_w * len(groups))
    width = left + plot_w + right
    out: list[str] = []
    legend_h = _legend(out, models, left, top + 6, plot_w)
    top += legend_h + 8
    label_h = 16 + 6 * min(24, max((len(g) for g in groups), default=0)) // 2
    plot_h = 240
    height = top + plot_h + label_h + 10
    lo, hi = _nice_range(
        [v for p in points for v in (p.value, p.low, p.high, p.baseline) if v is not None]
    )
    out = _svg_open(width, height, "scores", title) + out
    _y_axis(out, lo, hi, left, top, plot_w, plot_h, metric_label)

    def y_of(value: float) -> float:
        value = min(max(value, lo), hi)
        return top + plot_h - (value - lo) / (hi - lo) * plot_h

    base_y = y_of(max(lo, 0.0))
    for gi, group in enumerate(groups):
        gx = left + gi * (plot_w / len(groups)) + (plot_w / len(groups) - bar_w * len(models)) / 2
        for mi, model in enumerate(models):
            point = by_key.get((group, model))
            if point is None:
                continue
            x = gx + mi * bar_w
            y = y_of(point.value)
            color = PALETTE[mi % len(PALETTE)]
            hover = escape(point.label or f"{model} / {group}: {point.value:.3f}")
            out.append(f'<g class="mb-bar"><title>{hover}</title>')
            out.append(
                f'<rect x="{x + 1:.1f}" y="{min(y, base_y):.1f}" width="{bar_w - 2}" '
                f'height="{abs(base_y - y):.1f}" fill="{color}" fill-opacity="0.85"/>'
            )
            if point.low is not None and point.high is not None:
                _whisker(out, x + bar_w / 2, y_of(point.low), y_of(point.high), bar_w / 4)
            if point.baseline is not None:
                by = y_of(point.baseline)
                out.append(
                    f'<line class="mb-baseline" x1="{x - 1:.1f}" x2="{x + bar_w + 1:.1f}" '
                    f'y1="{by:.1f}" y2="{by:.1f}" stroke="#000" stroke-width="2.5" '
                    f'stroke-dasharray="4 2"/>'
                )
            out.append("</g>")
        cx = left + (gi + 0.5) * (plot_w / len(groups))
        out.append(
            f'<text x="{cx:.1f}" y="{top + plot_h + 16}" text-anchor="middle" fill="#222">'
            f"{escape(group)}</text>"
        )
    out.append(
        f'<line x1="{left}" x2="{left + plot_w}" y1="{base_y:.1f}" y2="{base_y:.1f}" '
        f'stroke="#888"/>'
    )
    note_y = height - 4
    out.append(
        f'<text x="{left + plot_w}" y="{note_y}" text-anchor="end" fill="#666" font-size="10">'
        "whiskers: 95% CI · dashed black: baseline</text>"
    )
    out.append("</svg>")
    return "".join(out)


def checkpoint_chart(points: Sequence[Point], family: str, metric_label: str = "score") -> str:
    """Score vs step: one line per variant (``Point.group``), whiskers at each checkpoint."""
    series = list(dict.fromkeys(p.group for p in points))
    steps = sorted({p.step for p in points})
    left, right, top = 56, 24, 34
    plot_w = max(420, 60 * len(steps))
    width = left + plot_w + right
    out: list[str] = []
    legend_h = _legend(out, series, left, top + 6, plot_w)
    top += legend_h + 8
    plot_h = 220
    height = top + plot_h + 44
    lo, hi = _nice_range([v for p in points for v in (p.value, p.low, p.high) if v is not None])
    title = f"{family}: {metric_label} vs checkpoint step"
    out = _svg_open(width, height, "checkpoints", title) + out
    _y_axis(out, lo, hi, left, top, plot_w, plot_h, metric_label)
    s_lo, s_hi = (steps[0], steps[-1]) if steps else (0, 1)
    span = (s_hi - s_lo) or 1

    def x_of(step: int) -> float:
        if s_hi == s_lo:
            return left + plot_w / 2
        return left + 10 + (step - s_lo) / span * (plot_w - 20)

    def y_of(value: float) -> float:
        value = min(max(value, lo), hi)
        return top + plot_h - (value - lo) / (hi - lo) * plot_h

    for step in steps:
        out.append(
            f'<text x="{x_of(step):.1f}" y="{top + plot_h + 16}" text-anchor="middle" '
            f'fill="#444">{step}</text>'
        )
    out.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{top + plot_h + 34}" text-anchor="middle" '
        f'fill="#444">step</text>'
    )
    for si, name in enumerate(series):
        color = PALETTE[si % len(PALETTE)]
        line = sorted((p for p in points if p.group == name), key=lambda p: p.step)
        coords = " ".join(f"{x_of(p.step):.1f},{y_of(p.value):.1f}" for p in line)
        out.append(
            f'<polyline class="mb-line" points="{coords}" fill="none" stroke="{color}" '
            f'stroke-width="2"/>'
        )
        for p in line:
            x, y = x_of(p.step), y_of(p.value)
            hover = escape(p.label or f"{name} step {p.step}: {p.value:.3f}")
            out.append(f'<g class="mb-point"><title>{hover}</title>')
            if p.low is not None and p.high is not None:
                _whisker(out, x, y_of(p.low), y_of(p.high), 4)
            out.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{color}" stroke="#fff"/></g>'
            )
    out.append("</svg>")
    return "".join(out)
