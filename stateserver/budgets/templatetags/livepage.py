"""The live page's filters: bytes as KB/MB/GB, and a colour per phase of a round."""
from django import template

register = template.Library()

#: the categories of a round's time (esync.breakdown) -> their colour in the bars
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
