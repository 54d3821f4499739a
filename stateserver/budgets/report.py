"""What a live report may say: the body of POST /jobs/<job>/report/, checked field by
field (apart from HTTP and the database, so that it is tested in process).

Every process of a job reports a few figures every second or so (esync.logs.live): a worker
(its rank), the evaluator and the launcher. A report replaces what its process said
before; absent fields are "not known", not zero. Fields:

    role                "worker", "evaluator" or "launcher" (required)
    rank                a worker's rank, 0..MAX_RANK (required for a worker)
    mode                the job's mode (esync, sync, async, dcasgd, ddp, local, ...)
    device              the device's name (cpu-x4, gpu0, ...)
    round               the latest round (global iteration) it finished
    budget              ESync: local iterations of its latest round
    samples             samples trained on so far
    samples_per_second  since its previous report
    breakdown           {phase: seconds per round}, the latest round's phases summed
                        over its local iterations (fetch, compute, comm, wait, ...)
    bytes_sent, bytes_received   network bytes so far
    loss                mean training loss of the latest round
    metric, metric_name the latest evaluation's value and what it is (accuracy, val_loss)
    alive               false in a process's last report, as it ends
    workers             (launcher) the job's number of workers
    state               (launcher) running, finished, failed or interrupted
    processes           (launcher) {process name: running, restarting, exited N, ...}

A bad field is a BadReport naming it; nothing of the report is kept then.
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict

ROLES = ("worker", "evaluator", "launcher")
STATES = ("running", "finished", "failed", "interrupted")
#: the largest rank a report may carry (the budget API's MAX_WORKERS ranks)
MAX_RANK = 1023
#: the largest count of anything (samples, bytes, rounds): 2**53, exact in a float
MAX_COUNT = 2 ** 53
#: the largest rate or number of seconds taken
MAX_RATE = 1e12
MAX_PHASES = 16
MAX_PROCESSES = 2 * (MAX_RANK + 1) + 16
NAME = re.compile(r"[A-Za-z0-9_.,+:/ -]{1,64}")
SHORT = re.compile(r"[A-Za-z0-9_.,+:/ -]{1,32}")
SHOWN = 60


class BadReport(ValueError):
    """A field of a report that cannot be taken; the message names it."""


def _shown(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int past Python's int-to-str limit
        text = "a huge integer"
    return text if len(text) <= SHOWN else text[:SHOWN] + "..."


def _number(name: str, value: Any, high: float, whole: bool = False) -> float:
    kinds = int if whole else (int, float)
    if not isinstance(value, kinds) or isinstance(value, bool) or \
            not (0 <= value <= high):  # NaN fails this too; a huge int compares fine
        what = "an integer" if whole else "a number"
        raise BadReport(f"field '{name}' must be {what} in 0..{high:g}, got {_shown(value)}")
    return value if whole else float(value)


def _text(name: str, value: Any, pattern: re.Pattern = NAME) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        limit = 64 if pattern is NAME else 32
        raise BadReport(f"field '{name}' must be 1 to {limit} letters, digits, spaces or "
                        f"'_.,+:/-', got {_shown(value)}")
    return value


def _phases(value: Any) -> Dict[str, float]:
    if not isinstance(value, dict) or len(value) > MAX_PHASES:
        raise BadReport(f"field 'breakdown' must be an object of at most {MAX_PHASES} "
                        f"phases (name: seconds), got {_shown(value)}")
    return {_text("breakdown", k, SHORT): _number(f"breakdown.{k}", v, MAX_RATE)
            for k, v in value.items()}


def _processes(value: Any) -> Dict[str, str]:
    if not isinstance(value, dict) or len(value) > MAX_PROCESSES:
        raise BadReport(f"field 'processes' must be an object of at most {MAX_PROCESSES} "
                        f"processes (name: state), got {_shown(value)}")
    return {_text("processes", k, SHORT): _text(f"processes.{k}", v)
            for k, v in value.items()}


def _metric(value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or \
            not math.isfinite(value) or abs(value) > MAX_RATE:
        raise BadReport(f"field 'metric' must be a finite number, got {_shown(value)}")
    return float(value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadReport(f"field '{name}' must be true or false, got {_shown(value)}")
    return value


def _choice(name: str, value: Any, allowed) -> str:
    if value not in allowed or not isinstance(value, str):
        raise BadReport(f"field '{name}' must be one of {', '.join(allowed)}, "
                        f"got {_shown(value)}")
    return value


#: field -> how its value is checked (and made the kept value)
FIELDS = {
    "role": lambda v: _choice("role", v, ROLES),
    "rank": lambda v: _number("rank", v, MAX_RANK, whole=True),
    "mode": lambda v: _text("mode", v, SHORT),
    "device": lambda v: _text("device", v),
    "round": lambda v: _number("round", v, MAX_COUNT, whole=True),
    "budget": lambda v: _number("budget", v, MAX_COUNT, whole=True),
    "samples": lambda v: _number("samples", v, MAX_COUNT, whole=True),
    "samples_per_second": lambda v: _number("samples_per_second", v, MAX_RATE),
    "breakdown": _phases,
    "bytes_sent": lambda v: _number("bytes_sent", v, MAX_COUNT, whole=True),
    "bytes_received": lambda v: _number("bytes_received", v, MAX_COUNT, whole=True),
    "loss": lambda v: _number("loss", v, MAX_RATE),
    "metric": _metric,
    "metric_name": lambda v: _text("metric_name", v, SHORT),
    "alive": lambda v: _flag("alive", v),
    "workers": lambda v: _number("workers", v, MAX_RANK + 1, whole=True),
    "state": lambda v: _choice("state", v, STATES),
    "processes": _processes,
}


def read_report(body: Dict[str, Any]) -> Dict[str, Any]:
    """The report `body` (a decoded JSON object) as it is kept: every field checked,
    nulls dropped. BadReport names the first field that is wrong."""
    unknown = sorted(str(k) for k in body if k not in FIELDS)
    if unknown:
        raise BadReport(f"unknown field {_shown(unknown[0])}; a report has "
                        f"{', '.join(FIELDS)}")
    if "role" not in body:
        raise BadReport(f"field 'role' is missing ({', '.join(ROLES)})")
    report = {name: FIELDS[name](value) for name, value in body.items() if value is not None}
    if report["role"] == "worker" and "rank" not in report:
        raise BadReport("field 'rank' is missing (a worker's report names its rank)")
    if report["role"] != "worker":
        report.pop("rank", None)
    return report
