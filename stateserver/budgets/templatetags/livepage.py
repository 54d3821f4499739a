"""The live page's filters and tags: bytes as KB/MB/GB, a colour per phase of a round, and
the table's rows of devices."""
from typing import Any, Dict, Iterable, List

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

#: the categories of a round's time (esync.logs.breakdown) -> their colour in the bars
PHASE_COLOURS = {"fetch": "#e15759", "prep": "#f28e2b", "compute": "#4e79a7",
                 "communication": "#59a14f", "wait": "#bab0ac", "state_server": "#edc948"}
OTHER = "#b07aa1"  # "other", and any name not above


@register.filter
def bytes(value):
    """1234567 -> '1.2 MB'; nothing for a value not reported."""
    if not isinstance(value, (int, float)):
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return ""


@register.simple_tag
def phase_colour(name):
    return PHASE_COLOURS.get(name, OTHER)


def _fixed(value: Any, digits: int) -> str:
    """A number with `digits` decimals (the template's floatformat); nothing for a value
    not reported."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ""
    return f"{value:.{digits}f}"


def _shown(value: Any) -> str:
    return "" if value is None else escape(value)


def _bar(shares: List[tuple]) -> str:
    """The round's time as a bar of its phases, each its share wide."""
    if not shares:
        return ""
    title = ", ".join(f"{name} {seconds:.3f} s" for name, seconds, _ in shares)
    spans = "".join(f'<span style="width:{share:.1f}%;background:{phase_colour(name)}">'
                    f'</span>' for name, _, share in shares)
    return f'<span class="bar" title="{escape(title)}">{spans}</span>'


def _row(w: Dict[str, Any]) -> str:
    f, state = w["figures"], escape(w["state"])
    rnd, budget = _shown(f.get("round")), _shown(f.get("budget"))
    ago = w["seconds_since_report"]
    return (
        f'<tr class="device" data-rank="{w["rank"]}" data-state="{state}" '
        f'data-round="{rnd}" data-budget="{budget}" '
        f'data-rate="{_shown(f.get("samples_per_second"))}">\n'
        f'<td>{w["rank"]}</td><td class="text">{escape(f.get("device") or "")}</td>\n'
        f'<td class="text state-{state}">{state}</td><td>{rnd}</td>\n'
        f'<td class="budget">{escape(f.get("budget") or "-")}</td>\n'
        f'<td>{_fixed(f.get("samples_per_second"), 1)}</td>'
        f'<td>{_shown(f.get("samples"))}</td>\n'
        f'<td class="text">{_bar(w["shares"])}</td>\n'
        f'<td>{bytes(f.get("bytes_sent"))}</td><td>{bytes(f.get("bytes_received"))}</td>\n'
        f'<td>{_fixed(f.get("loss"), 3)}</td>\n'
        f'<td>{"" if ago is None else _fixed(ago, 0) + " s ago"}</td></tr>')


@register.simple_tag
def device_rows(workers: Iterable[Dict[str, Any]]) -> SafeString:
    """The table's row of each device (live.py's rows), written here rather than by the
    template language: a job of 1,000 devices has 12,000 cells, which the template's
    per-variable lookups and filters took most of a second to render."""
    rows = [_row(w) for w in workers]
    if not rows:
        return mark_safe('<tr><td colspan="12" class="text">no device has reported yet'
                         '</td></tr>')
    return mark_safe("\n".join(rows))
