"""Small line charts for the live page, drawn here as SVG (no script or asset from the
internet: the page shows them as they come from the state server)."""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple

from django.utils.html import escape

Series = Tuple[str, Sequence[Tuple[float, float]]]  # (label, [(x, y), ...])

#: colours of the lines, in turn (Tableau's 10)
COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")
WIDTH, HEIGHT = 420, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 10, 24, 30


def _ticks(low: float, high: float) -> List[float]:
    """About four round values from low to high."""
    if high <= low:
        return [low]
    step = 10 ** math.floor(math.log10((high - low) / 4))
    for factor in (1, 2, 5, 10):
        if (high - low) / (step * factor) <= 5:
            step *= factor
            break
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _label(value: float) -> str:
    if value and (abs(value) >= 1e5 or abs(value) < 1e-2):
        return f"{value:.1e}"
    return f"{value:.3g}"


def line_chart(title: str, series: Sequence[Series], unit: str = "",
               note: str = "") -> str:
    """An SVG of `series` against time (seconds), titled; `note` under the title (what
    was left out). Empty series are left out; none at all gives a chart saying so."""
    drawn = [(label, points) for label, points in series if points]
    head = (f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
            f'height="{HEIGHT}" role="img" aria-label="{escape(title)}">'
            f'<text x="{LEFT}" y="14" class="title">{escape(title)}'
            f'{escape(f" ({unit})" if unit else "")}</text>')
    if note:
        head += f'<text x="{WIDTH - RIGHT}" y="14" class="note">{escape(note)}</text>'
    if not drawn:
        return head + f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" class="empty">' \
                      f'nothing reported yet</text></svg>'
    xs = [x for _, points in drawn for x, _ in points]
    ys = [y for _, points in drawn for _, y in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(0.0, min(ys)), max(ys)
    if x1 == x0:
        x1 = x0 + 1.0
    if y1 == y0:
        y1 = y0 + 1.0
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def at(x: float, y: float) -> str:
        return (f"{LEFT + (x - x0) / (x1 - x0) * inner_w:.1f},"
                f"{TOP + inner_h - (y - y0) / (y1 - y0) * inner_h:.1f}")

    parts = [head, f'<rect x="{LEFT}" y="{TOP}" width="{inner_w}" height="{inner_h}" '
                   f'class="frame"/>']
    for tick in _ticks(y0, y1):
        y = TOP + inner_h - (tick - y0) / (y1 - y0) * inner_h
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + inner_w}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'class="grid"/><text x="{LEFT - 4}" y="{y + 4:.1f}" class="ytick">'
                     f'{_label(tick)}</text>')
    for tick in _ticks(x0, x1):
        x = LEFT + (tick - x0) / (x1 - x0) * inner_w
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 14}" class="xtick">'
                     f'{_label(tick)}</text>')
    parts.append(f'<text x="{LEFT + inner_w}" y="{HEIGHT - 2}" class="xlabel">seconds</text>')
    for i, (label, points) in enumerate(drawn):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(at(x, y) for x, y in points)
        parts.append(f'<polyline points="{path}" stroke="{colour}" class="line">'
                     f'<title>{escape(label)}</title></polyline>')
        if len(drawn) <= 8:  # a legend while it fits (a style: the page's CSS greys text)
            parts.append(f'<text x="{LEFT + 6 + (i % 4) * 90}" y="{TOP + 12 + (i // 4) * 12}" '
                         f'style="fill:{colour}" class="legend">{escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)
