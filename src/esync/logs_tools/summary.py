"""Summarise per-round iteration logs into one JSON file per training mode.

    esync-summary -b BASE -n NETWORK -m MODE

reads every `BASE/NETWORK/MODE/<host>/<device>/iter-<n>.json` (the framework's log
format, see the manual's log format page; a run logs there with `-ld BASE/NETWORK/MODE`), with
hosts and devices discovered from the folders, and writes `BASE/NETWORK/MODE/<Name>.json`:

    {host: {device: {"accuracy_list":      [...],  # accuracy, or null: round did not evaluate
                     "val_loss_list":      [...],  # val_loss (`--metric loss`), or null
                     "num_samples_list":   [...],  # num_samples
                     "self_iters_list":    [...],  # local iterations (entries of `time`)
                     "elapsed_time_list":  [...],  # total_time
                     "aggregate_time_list": [...], # `global aggregate` + `global update`
                                                   #   + `balance batches`
                     "compute_time_list":  [...],  # get_batch + forward and backward
                                                   #   + local update + slowdown
                     "bytes_list":         [...],  # bytes_sent + bytes_received
                     "loss_list":          [...],  # loss (null stays null)
                     "rounds_list":        [...]}}}  # num_iters

one entry per round, in round order (n sorted numerically). Hosts and devices are
sorted by name. A job's evaluations measure one metric: test accuracy (higher is
better), or with `--metric loss` a validation loss (`val_loss`, lower is better); the
other list is then all null. Both lists are always there, so that a reader need not
know the job's flags.

Where the time went. A device whose logs have the per-round `breakdown` (or the data
loader's counters beside it) has these lists too, one entry per round, null in a round
whose file lacks the field (a category missing from a `breakdown` counts 0: DDP has no
`wait`):

    "breakdown_fetch_list":         [...],  # breakdown.fetch: blocked reading shards
    "breakdown_prep_list":          [...],  # breakdown.prep: blocked on decoding,
                                            #   transforms, collation
    "breakdown_compute_list":       [...],  # breakdown.compute (+ slowdown)
    "breakdown_communication_list": [...],  # breakdown.communication
    "breakdown_wait_list":          [...],  # breakdown.wait
    "breakdown_state_server_list":  [...],  # breakdown.state_server
    "breakdown_other_list":         [...],  # breakdown.other
    "prep_seconds_list":            [...],  # prep_seconds: decoding work (not a stall)
    "read_bytes_list":              [...],  # read_bytes (shards)
    "read_seconds_list":            [...],  # read_seconds (shards)
    "cache_hits_list":              [...],  # cache_hits
    "remote_batches_list":          [...],  # remote_batches

and the device's totals (`totals(record)`):

    "totals": {"rounds": n, "samples": n,
               "elapsed_seconds": s,          # its last total_time
               "samples_per_second": x,       # samples / elapsed_seconds
               "breakdown_rounds": n,         # rounds with a breakdown
               "breakdown_seconds": s,        # their wall time: the categories' sum
               "seconds": {category: s},      # per category, over those rounds
               "share": {category: x},        # seconds / breakdown_seconds
               "prep_seconds": s, "read_bytes": b, "read_seconds": s,
               "read_MB_per_s": x,            # read_bytes / read_seconds / 1e6
               "cache_hits": n, "remote_batches": n}

A total no round had a value for is null (seconds and share without a breakdown,
read_MB_per_s without read seconds, samples_per_second when elapsed_seconds is 0). The
categories sum to each round's wall time, so breakdown_seconds is about elapsed_seconds
when every round has a breakdown. A device whose logs have none of these fields (logs
older than the breakdown; the evaluator's) has none of these lists and no totals: its
record is as above.

<Name> comes from the MODE folder name (`name_of`), through esync.registry: each
algorithm's log folder has its summary name (esync -> ESync, sync -> Sync, async ->
Async, dcasgd -> DCASGD, local -> Local), and a split-by-class folder (`-niid`) has the
name's non-IID form (esync-niid -> ESync-Non-IID). Any other folder name is used as it
is (`my-run` -> `my-run.json`).

Broken iteration files (unreadable, empty, invalid JSON, wrongly shaped, a round
number that does not match the file name) are reported on stderr, one line each
(`summary.py: skipped PATH: reason`), and skipped; missing rounds (gaps in 1..n) are
reported the same way. A device folder without a usable file, or a host folder without
a device folder, is reported and left out. Files not named `iter-<n>.json` (`.lock`,
`iter-<n>.json.partial`) are ignored silently. Fatal errors (a missing MODE folder, no
device folders, no usable file at all) print `summary.py: error: ...` and exit with
status 2 without writing anything; a failure to write the output exits with status 1.

Library use (the drawer, the experiment): `summarize(base, network, mode) -> dict`
(raises UserError), `write_summary(base, network, mode) -> (path, dict)`,
`totals(record) -> dict`, `name_of(mode) -> str`, `output_path(base, network, mode) ->
str`, `main(argv=None) -> int`. Standard library, esync.registry and esync.logs.breakdown
(the categories; pure arithmetic) only: no torch, nothing of the runtime.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from typing import Callable, Dict, List, Optional, Tuple

from esync import config
from esync import registry
from esync.logs.breakdown import CATEGORIES
from esync.logs_tools import error_type, user_error

PROG = "summary.py"

COMPUTE_PHASES = ("get_batch", "forward and backward", "local update", "slowdown")
AGGREGATE_PHASES = ("global aggregate", "global update", "balance batches")

FIELDS = ("accuracy_list", "val_loss_list", "num_samples_list", "self_iters_list",
          "elapsed_time_list", "aggregate_time_list", "compute_time_list", "bytes_list",
          "loss_list", "rounds_list")

#: the categories of a round's `breakdown`, in drawing order
BREAKDOWN_CATEGORIES = CATEGORIES
BREAKDOWN_LISTS = {c: f"breakdown_{c}_list" for c in BREAKDOWN_CATEGORIES}
#: the loader's per-round counters beside the breakdown: field -> (list, a count?)
COUNTERS = {"prep_seconds": ("prep_seconds_list", False),
            "read_bytes": ("read_bytes_list", True),
            "read_seconds": ("read_seconds_list", False),
            "cache_hits": ("cache_hits_list", True),
            "remote_batches": ("remote_batches_list", True)}
#: the lists of a device whose logs have a breakdown or a counter (see the docstring)
BREAKDOWN_FIELDS = tuple(BREAKDOWN_LISTS.values()) + tuple(l for l, _ in COUNTERS.values())

_ITER_FILE = re.compile(r"iter-([0-9]+)\.json")

Warn = Callable[[str], None]


def __getattr__(name: str) -> type:
    """SummaryError: bad input (esync.errors.UserError, by the name this module's callers
    know; loaded on first use)."""
    return error_type(__name__, name, "SummaryError")


class BadFile(Exception):
    """One iteration file that cannot be used (the message is the reason)."""


def name_of(mode: str) -> str:
    """The output name of a MODE folder: 'esync-niid' -> 'ESync-Non-IID'; unknown: as is."""
    mode = os.path.basename(os.path.normpath(mode)) if mode else mode
    known = registry.from_folder(mode)
    if known is None:
        return mode
    algorithm, split_by_class = known
    return algorithm.summary_name(split_by_class)


def mode_dir(base: str, network: str, mode: str) -> str:
    return os.path.join(base, network, mode)


def output_path(base: str, network: str, mode: str) -> str:
    return os.path.join(mode_dir(base, network, mode), name_of(mode) + ".json")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


# --- one iteration file ------------------------------------------------------------------

def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _load(path: str) -> dict:
    """Read one iteration file; BadFile with the reason if it is unusable."""
    try:
        if not os.path.exists(path):
            raise BadFile("missing (a dangling link)" if os.path.lexists(path) else "missing")
        if not os.path.isfile(path):
            raise BadFile("not a regular file")
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise BadFile("missing") from None
        raise BadFile(f"cannot read: {e.strerror or e}") from None
    if not raw.strip():
        raise BadFile("empty file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadFile("not UTF-8 text") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:  # JSONDecodeError, NaN/Infinity
        raise BadFile(f"invalid JSON: {e}") from None
    except RecursionError:
        raise BadFile("invalid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise BadFile(f"not a JSON object ({type(data).__name__})")
    return data


def _evaluation(data: dict, key: str) -> Optional[float]:
    """The round's evaluation under key ('accuracy', or 'val_loss' with `--metric loss`),
    None where the round did not evaluate; BadFile if it is there but not a number."""
    value = data.get(key)
    if value is not None and not _is_number(value):
        raise BadFile(f"{key!r} is not a number: {value!r}")
    return value


def _round_record(data: dict, n: int) -> dict:
    """The summary values of one round; BadFile if the file is wrongly shaped."""
    if "num_iters" not in data:
        raise BadFile("no 'num_iters'")
    num_iters = data["num_iters"]
    if not _is_count(num_iters):
        raise BadFile(f"'num_iters' is not a round number: {num_iters!r}")
    if num_iters != n:
        raise BadFile(f"'num_iters' is {num_iters}, the file name says {n}")

    times = data.get("time")
    if not isinstance(times, dict):
        raise BadFile("'time' is missing or not an object")
    compute: List[float] = []
    aggregate: List[float] = []
    for i, phases in times.items():
        if not isinstance(phases, dict):
            raise BadFile(f"'time'[{i!r}] is not an object")
        for phase, seconds in phases.items():
            if not _is_number(seconds):
                raise BadFile(f"'time'[{i!r}][{phase!r}] is not a number: {seconds!r}")
            if phase in COMPUTE_PHASES:
                compute.append(seconds)
            elif phase in AGGREGATE_PHASES:
                aggregate.append(seconds)

    for key in ("num_samples", "bytes_sent", "bytes_received"):
        if key not in data:
            raise BadFile(f"no {key!r}")
        if not _is_count(data[key]):
            raise BadFile(f"{key!r} is not a count: {data[key]!r}")
    if "total_time" not in data:
        raise BadFile("no 'total_time'")
    if not _is_number(data["total_time"]):
        raise BadFile(f"'total_time' is not a number: {data['total_time']!r}")
    loss = data.get("loss")
    if loss is not None and not _is_number(loss):
        raise BadFile(f"'loss' is neither a number nor null: {loss!r}")
    accuracy = _evaluation(data, "accuracy")
    val_loss = _evaluation(data, "val_loss")

    return {
        **_breakdown_values(data),
        "accuracy_list": accuracy,
        "val_loss_list": val_loss,
        "num_samples_list": data["num_samples"],
        "self_iters_list": len(times),
        "elapsed_time_list": data["total_time"],
        "aggregate_time_list": math.fsum(aggregate),
        "compute_time_list": math.fsum(compute),
        "bytes_list": data["bytes_sent"] + data["bytes_received"],
        "loss_list": loss,
        "rounds_list": num_iters,
    }


def _breakdown_values(data: dict) -> dict:
    """The round's breakdown lists' and counters' values (None where its file lacks the
    field; 0 for a category a breakdown lacks); BadFile if one is wrongly shaped."""
    out = {}
    split = data.get("breakdown")
    if split is not None and not isinstance(split, dict):
        raise BadFile(f"'breakdown' is not an object: {split!r}")
    for category, key in BREAKDOWN_LISTS.items():
        value = None if split is None else split.get(category, 0)
        if value is not None and not _is_number(value):
            raise BadFile(f"'breakdown'[{category!r}] is not a number: {value!r}")
        out[key] = value
    for field, (key, count) in COUNTERS.items():
        value = data.get(field)
        if value is not None and not (_is_count(value) if count else _is_number(value)):
            raise BadFile(f"{field!r} is not a {'count' if count else 'number'}: {value!r}")
        out[key] = value
    return out


def _sum(values: list, count: bool = False):
    """The sum of the non-null values (of counts: an exact int); None if all are null."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return sum(present) if count else math.fsum(present)


def _ratio(a, b):
    return a / b if a is not None and b else None


def totals(record: dict) -> dict:
    """The `totals` of a device's record with the breakdown lists (see the docstring)."""
    samples = sum(record["num_samples_list"])
    elapsed = record["elapsed_time_list"][-1]
    split = [i for i, v in enumerate(record[BREAKDOWN_LISTS["other"]]) if v is not None]
    seconds = {c: math.fsum(record[key][i] for i in split)
               for c, key in BREAKDOWN_LISTS.items()} if split else None
    wall = math.fsum(seconds.values()) if seconds else None
    counters = {field: _sum(record[key], count) for field, (key, count) in COUNTERS.items()}
    read_rate = _ratio(counters["read_bytes"], counters["read_seconds"])
    return {
        "rounds": len(record["rounds_list"]),
        "samples": samples,
        "elapsed_seconds": elapsed,
        "samples_per_second": samples / elapsed if elapsed > 0 else None,
        "breakdown_rounds": len(split),
        "breakdown_seconds": wall,
        "seconds": seconds,
        "share": {c: v / wall for c, v in seconds.items()} if wall else None,
        "prep_seconds": counters["prep_seconds"],
        "read_bytes": counters["read_bytes"],
        "read_seconds": counters["read_seconds"],
        "read_MB_per_s": read_rate / 1e6 if read_rate is not None else None,
        "cache_hits": counters["cache_hits"],
        "remote_batches": counters["remote_batches"],
    }


# --- folders -----------------------------------------------------------------------------

def _subdirs(path: str) -> List[str]:
    """Sorted names of the visible sub-folders of path (OSError if unreadable)."""
    with os.scandir(path) as it:
        return sorted(e.name for e in it
                      if not e.name.startswith(".") and e.is_dir(follow_symlinks=True))


def _iteration_files(device_dir: str) -> List[Tuple[int, str]]:
    """(n, name) of the iter-<n>.json entries, sorted by n (OSError if unreadable)."""
    found = []
    with os.scandir(device_dir) as it:
        for e in it:
            m = _ITER_FILE.fullmatch(e.name)
            if m:
                found.append((int(m.group(1)), e.name))
    found.sort()
    return found


def _report_gap(warn: Warn, device_dir: str, first: int, last: int) -> None:
    if first == last:
        warn(f"{PROG}: skipped {os.path.join(device_dir, f'iter-{first}.json')}: missing")
    else:
        warn(f"{PROG}: skipped {os.path.join(device_dir, f'iter-{first}.json')} .. "
             f"iter-{last}.json: missing ({last - first + 1} files)")


def summarize_device(device_dir: str, warn: Optional[Warn] = None) -> Optional[dict]:
    """The record of one device folder, or None (reported) if it has no usable file."""
    warn = warn or _stderr
    try:
        files = _iteration_files(device_dir)
    except OSError as e:
        warn(f"{PROG}: skipped {device_dir}: cannot list: {e.strerror or e}")
        return None
    record: dict = {k: [] for k in FIELDS + BREAKDOWN_FIELDS}
    expected = 1
    for n, name in files:
        path = os.path.join(device_dir, name)
        if n < 1:
            warn(f"{PROG}: skipped {path}: rounds count from 1")
            continue
        if name != f"iter-{n}.json":
            warn(f"{PROG}: skipped {path}: round number with leading zeros")
            continue
        if n > expected:
            _report_gap(warn, device_dir, expected, n - 1)
        expected = max(expected, n + 1)
        try:
            values = _round_record(_load(path), n)
        except BadFile as e:
            warn(f"{PROG}: skipped {path}: {e}")
            continue
        for k in record:
            record[k].append(values[k])
    if not record["rounds_list"]:
        warn(f"{PROG}: skipped {device_dir}: no usable iteration files")
        return None
    if not any(v is not None for k in BREAKDOWN_FIELDS for v in record[k]):
        return {k: record[k] for k in FIELDS}  # older logs: the record as it was
    record["totals"] = totals(record)
    return record


def summarize(base: str, network: str, mode: str, warn: Optional[Warn] = None) -> dict:
    """{host: {device: record}} for BASE/NETWORK/MODE; problems go to warn (stderr).

    Raises UserError if the folder is missing, has no device folders, or no usable
    iteration file at all.
    """
    warn = warn or _stderr
    root = mode_dir(base, network, mode)
    if not os.path.isdir(root):
        raise user_error(f"no such folder: {root}")
    try:
        hosts = _subdirs(root)
    except OSError as e:
        raise user_error(f"cannot list {root}: {e.strerror or e}") from None
    result: Dict[str, dict] = {}
    any_device = False
    for host in hosts:
        host_dir = os.path.join(root, host)
        try:
            devices = _subdirs(host_dir)
        except OSError as e:
            warn(f"{PROG}: skipped {host_dir}: cannot list: {e.strerror or e}")
            continue
        if not devices:
            warn(f"{PROG}: skipped {host_dir}: no device folders")
            continue
        any_device = True
        for device in devices:
            record = summarize_device(os.path.join(host_dir, device), warn)
            if record is not None:
                result.setdefault(host, {})[device] = record
    if not any_device:
        raise user_error(f"no <host>/<device> folders in {root}")
    if not result:
        raise user_error(f"no usable iteration files in {root}")
    return result


def write_json(path: str, data: dict) -> None:
    """Write data to path atomically (a reader sees the old file or the whole new one)."""
    tmp = f"{path}.{os.getpid()}.partial"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


# --- command line ------------------------------------------------------------------------

def _folder_name(flag: str):
    def check(value: str) -> str:
        value = value.rstrip("/") if value.strip("/") else value
        if not value or value in (".", "..") or "/" in value or os.sep in value:
            raise argparse.ArgumentTypeError(f"{flag} must be a single folder name, "
                                             f"got {value!r}")
        return value
    return check


def write_summary(base: str, network: str, mode: str,
                  warn: Optional[Warn] = None) -> Tuple[str, dict]:
    """Summarise BASE/NETWORK/MODE and write <Name>.json there: (its path, the summary).
    UserError if there is nothing to summarise, OSError if it cannot be written."""
    summary = summarize(base, network, mode, warn)
    out = output_path(base, network, mode)
    write_json(out, summary)
    return out, summary


def wrote_line(out: str, summary: dict) -> str:
    devices = sum(len(d) for d in summary.values())
    rounds = sum(len(r["rounds_list"]) for d in summary.values() for r in d.values())
    return (f"{PROG}: wrote {out}: {len(summary)} host(s), {devices} device(s), "
            f"{rounds} round(s)")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Summarise BASE/NETWORK/MODE/<host>/<device>/iter-<n>.json into "
                    "BASE/NETWORK/MODE/<Name>.json (esync -> ESync.json, "
                    "sync-niid -> Sync-Non-IID.json, other folder names as they are).")
    p.add_argument("-b", "--base-dir", default=config.LOG_DIR,
                   help=f"base folder of the logs (default: {config.LOG_DIR})")
    p.add_argument("-n", "--network", required=True, type=_folder_name("-n/--network"),
                   help="network folder, e.g. lenet")
    p.add_argument("-m", "--mode", required=True, type=_folder_name("-m/--mode"),
                   help="mode folder: esync, sync, async, dcasgd, local, with an "
                        "optional -niid suffix")
    return p


def main(argv: Optional[List[str]] = None, prog: Optional[str] = None) -> int:
    """The `esync-summary` command (see the module's docstring)."""
    from esync.errors import command_main

    return command_main(_main, argv, prog, PROG)


def _main(argv: List[str], prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    summary = summarize(args.base_dir, args.network, args.mode)
    out = output_path(args.base_dir, args.network, args.mode)
    try:
        write_json(out, summary)
    except OSError as e:
        print(f"{prog}: error: cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(wrote_line(out, summary))
    return 0


def console_main() -> int:
    """The `esync-summary` command."""
    return main()


if __name__ == "__main__":
    sys.exit(main())
