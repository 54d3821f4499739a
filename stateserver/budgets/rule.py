"""ESync's budget rule, apart from HTTP and the database.

Every device should compute for about as long as the slowest device needs for one
local iteration, so nobody idles at the aggregation: the slowest device runs 1 local
iteration a round, and a device k times faster runs about k.
"""
from __future__ import annotations

from typing import Optional, Sequence


def smooth(previous: Optional[float], measured: float, weight: float) -> float:
    """Exponential moving average of a device's time per local iteration (the first
    measurement is taken as it is), so that one noisy round does not swing the budget."""
    if previous is None:
        return measured
    return (1.0 - weight) * previous + weight * measured


def budget(mine: Optional[float], everyone: Sequence[Optional[float]], cap: int) -> int:
    """Local iterations for a device with smoothed time per iteration `mine`, given every
    device's (`None`: not measured yet). As many as fit in the slowest device's time,
    rounded to the nearest whole number (the device then waits or is waited for at most
    half an iteration), at least 1, at most `cap`. Until every device has a measurement
    (round 1, and round 2 for devices that ask before others reported), the budget is 1:
    the same as SSGD."""
    if mine is None or any(t is None for t in everyone):
        return 1
    slowest = max(everyone)
    return max(1, min(cap, int(slowest / mine + 0.5)))
