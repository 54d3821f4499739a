"""Where each device's time went, and its pace: the data and the axes of two of the
drawer's figures (drawer.py makes the figures and saves them).

* ``breakdown.png``: one stacked horizontal bar per training device, grouped by mode, of
  the share of its wall-clock time in each category of the rounds' ``breakdown`` (fetch,
  prep, compute, communication, wait, state server, other; the summary's
  ``totals["seconds"]``), its seconds in all written at the bar's end. The original's
  "computing time ratio" made complete: compute is one of the segments, and the rest of
  the time is accounted for. Devices whose logs have no breakdown (older logs) are not
  in it.
* ``rates.png``: each training device's samples per second over wall-clock time, one
  line per device, one panel per mode: per round, its samples over its duration (the
  differences of ``elapsed_time_list``, the first round's from 0), averaged over a
  window of rounds (``window``: a 50th of the rounds, at least 1) so that many short
  rounds do not draw a band of noise.

Both read a list of groups, ``[(mode name, [(device label, summary record)])]``, the
training devices of each mode (drawer.device_groups). No pyplot here: the functions
fill given axes. Matplotlib's axes only; no torch, nothing of esync.
"""

import math

from esync.logs_tools.summary import BREAKDOWN_CATEGORIES

CATEGORIES = BREAKDOWN_CATEGORIES
LABELS = {"fetch": "fetch (shard reads)", "prep": "prep (decode, transform)",
          "compute": "compute", "communication": "communication",
          "wait": "wait for others", "state_server": "state server", "other": "other"}
COLORS = {"fetch": "tab:red", "prep": "tab:orange", "compute": "tab:green",
          "communication": "tab:blue", "wait": "tab:gray", "state_server": "tab:purple",
          "other": "lightgray"}
GROUP_GAP = 1.0  # rows before a mode's bars: its name goes there


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# ---------------------------------------------------------------- breakdown.png

def device_seconds(record):
    """{category: seconds} of a summary record's totals; None if it has none (logs older
    than the breakdown). ValueError if they are there but unusable."""
    totals = record.get("totals")
    seconds = totals.get("seconds") if isinstance(totals, dict) else None
    if seconds is None:
        return None
    if not isinstance(seconds, dict):
        raise ValueError("totals.seconds is not an object")
    out = {c: seconds.get(c, 0) for c in CATEGORIES}
    bad = [c for c, v in out.items() if not (_is_num(v) and v >= 0)]
    if bad:
        raise ValueError(f"totals.seconds[{bad[0]!r}] is {out[bad[0]]!r}")
    return out if sum(out.values()) > 0 else None


def breakdown_rows(groups, warn):
    """[(mode, [(device, {category: seconds})])] of the devices with a breakdown, modes
    without one left out; a device with unusable totals is left out with a note (warn)."""
    rows = []
    for mode, devices in groups:
        found = []
        for device, record in devices:
            try:
                seconds = device_seconds(record)
            except ValueError as e:
                warn(f"{mode} {device}: {e}; left out of breakdown.png")
                continue
            if seconds is not None:
                found.append((device, seconds))
        if found:
            rows.append((mode, found))
    return rows


def breakdown_height(rows):
    """The figure's height (inches) for the bars of rows."""
    bars = sum(len(devices) for _, devices in rows)
    return max(3.5, 0.4 * (bars + len(rows)) + 2.2)


def _positions(rows):
    """(the y of each bar, the y of each mode's name): top down, a gap before a mode."""
    ys, heads, y = [], [], 0.0
    for _, devices in rows:
        heads.append(y)
        y += GROUP_GAP
        ys.append([y + i for i in range(len(devices))])
        y += len(devices)
    return ys, heads


def plot_breakdown(ax, rows):
    """Stacked bars of each device's share of time per category, a mode's devices under
    its name, the seconds in all at each bar's end."""
    ys, heads = _positions(rows)
    flat = [(y, d, s) for (_, devs), yy in zip(rows, ys) for y, (d, s) in zip(yy, devs)]
    walls = [sum(s.values()) for _, _, s in flat]
    left = [0.0] * len(flat)
    for c in CATEGORIES:
        shares = [s[c] / w for (_, _, s), w in zip(flat, walls)]
        ax.barh([y for y, _, _ in flat], shares, 0.7, left=left, color=COLORS[c],
                label=LABELS[c])
        left = [a + b for a, b in zip(left, shares)]
    for (y, _, _), w in zip(flat, walls):
        ax.text(1.01, y, f"{w:.3g} s", va="center", fontsize=8)
    for (mode, _), y in zip(rows, heads):
        ax.text(0, y, mode, va="center", fontweight="bold")
    ax.set_yticks([y for y, _, _ in flat], [d for _, d, _ in flat])
    ax.set_ylim(max([y for y, _, _ in flat] + [0]) + 0.6, -0.7)  # top down
    ax.set_xlim(0, 1.14)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1])
    ax.set_xlabel("Share of the device's wall-clock time (its seconds at the bar's end)")
    ax.set_title("Where the time went")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4, fontsize=8,
              frameon=False)


# ---------------------------------------------------------------- rates.png

def window(rounds):
    """Rounds averaged into one point of the rate: a 50th of them, at least 1."""
    return max(1, rounds // 50)


def samples_per_second(record, size=None):
    """([elapsed s], [samples/s]) of a record: at each round's end, the samples of the
    last `size` rounds (default window(rounds)) over the time they took; rounds with no
    time behind them (elapsed not increasing) are left out. Null samples count 0."""
    times = record["elapsed_time_list"]
    samples = [s or 0 for s in record["num_samples_list"]]
    size = size or window(len(times))
    xs, ys = [], []
    for i, t in enumerate(times):
        first = max(0, i - size + 1)
        start = times[first - 1] if first > 0 else 0.0
        if t > start:
            xs.append(t)
            ys.append(sum(samples[first:i + 1]) / (t - start))
    return xs, ys


def rate_series(groups):
    """[(mode, [(device, xs, ys)])] of the modes with a rate to draw."""
    out = []
    for mode, devices in groups:
        lines = [(d, *samples_per_second(r)) for d, r in devices]
        lines = [line for line in lines if line[1]]
        if lines:
            out.append((mode, lines))
    return out


def rates_grid(series):
    """(rows, columns) of the panels: one column up to three modes, else two."""
    n = max(1, len(series))
    cols = 1 if n <= 3 else 2
    return math.ceil(n / cols), cols


def plot_rates(ax, mode, lines):
    """One panel: each device's samples per second over time."""
    for device, xs, ys in lines:
        ax.plot(xs, ys, label=device, linewidth=1.2)
    ax.set_title(f"{mode}: samples per second per device")
    ax.set_xlabel("Wall-clock time (s)")
    ax.set_ylabel("Samples / s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=2 if len(lines) > 4 else 1)
