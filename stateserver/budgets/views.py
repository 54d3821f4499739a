"""The budget API: JSON over HTTP (explained in the manual: docs/explanation/state-server.md).

    GET  /  or  /status/       the jobs' states, a page at a time (?limit=N&offset=M)
    POST /jobs/<job>/          {"workers": N, "max_local_steps": M, "round_time": S or
                               null, "coordination_share": s, "least_speed": l}:
                               initialise a job;
                               with "resume_round": r, also rewind it so that rounds
                               from r on are accepted again (a job resumed from a
                               checkpoint)
    GET  /jobs/<job>/          one job's state
    POST /jobs/<job>/budget/   {"rank": r, "round": t, "time_per_iteration": s or null,
                               "coordination": c (optional), "interim": true
                               (optional: a time so far of the round asked for last,
                               which updates the time only)}: report and get this
                               round's budget, and whether the round measures speeds
                               ("measuring": the device's delta weighs nothing) and
                               whether it is open ("open": it may last until every
                               device has measured; esync.algorithms.esync.budget.opens)

A bad request gets HTTP 400 (unknown job: 404; wrong method: 405) with
{"error": "..."} naming the field, and changes nothing. What reaches a view has passed
budgets.guard (body size, framing, token). Each request's work is bounded: at most
MAX_WORKERS devices per job, at most STATUS_MAX_LIMIT jobs and about PAGE_DEVICES
devices per page of the status.
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any, Dict, List, Optional, Tuple

from django.conf import settings
from budgets.database import select, writing
from django.http import HttpRequest, JsonResponse
from django.utils import timezone

from esync import config

from esync.algorithms.esync import budget as budget_rule
from budgets.models import Device, Job

log = logging.getLogger("budgets")

JOB_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: workers of one job: each has a row, and every answer about the job lists them all
MAX_WORKERS = 1024
MAX_LOCAL_STEPS = 1_000_000
MAX_ROUND_TIME = 86_400.0  # seconds: a day
#: the largest time per local iteration taken (11.6 days): bounds the moving average
MAX_SECONDS = 1e6
#: the largest round or rank (the database's positive integers)
MAX_INT = 2**31 - 1
#: how far beyond the job's latest round a budget request may be: a living worker asks
#: at most 1 round ahead, a worker taking a dead one's place 2; a write far ahead (a
#: stranger's, without ESYNC_STATE_TOKEN) would make that rank's real requests "past"
MAX_ROUNDS_AHEAD = 8
#: jobs per page of GET /status/ by default, and at most (?limit=)
STATUS_LIMIT = 50
STATUS_MAX_LIMIT = 500
#: a page of the status ends early, before the job that would take it past this many
#: devices (it has at least one job)
PAGE_DEVICES = 4096
#: characters of a refused value or URL that an error message repeats
SHOWN = 80


#: what a budget request (not an interim one) changes in its device's row
ANSWERED = ("times_reported", "last_time", "smoothed_time", "last_coordination",
            "smoothed_coordination", "budget", "measuring", "rounds_out", "round", "reports",
            "reported_at")


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _error(message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def api(*methods: str):
    """Allow `methods` only, and turn BadRequest into a JSON error answer."""

    def wrap(view):
        def handle(request: HttpRequest, **kwargs) -> JsonResponse:
            if request.method not in methods:
                response = _error(f"{request.method} is not allowed here; use "
                                  f"{' or '.join(methods)}", 405)
                response["Allow"] = ", ".join(methods)
                return response
            try:
                return view(request, **kwargs)
            except BadRequest as e:
                return _error(str(e), e.status)

        handle.__name__ = view.__name__
        handle.__doc__ = view.__doc__
        return handle

    return wrap


# --- reading requests ------------------------------------------------------------------
def _shown(value: Any) -> str:
    """A refused value as an error message repeats it: its repr, cut to SHOWN characters."""
    try:
        text = repr(value)
    except ValueError:  # an int too long for Python's int-to-str limit
        text = "a huge integer"
    return text if len(text) <= SHOWN else text[:SHOWN] + "..."


def _body(request: HttpRequest) -> Dict[str, Any]:
    try:
        body = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError):  # also: integers of thousands of digits
        raise BadRequest("the request body is not valid JSON") from None
    except RecursionError:  # arrays or objects nested a thousand deep
        raise BadRequest("the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _integer(body: Dict[str, Any], name: str, low: int, high: int = MAX_INT) -> int:
    if name not in body:
        raise BadRequest(f"field '{name}' is missing")
    value = body[name]
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(f"field '{name}' must be an integer in {low}..{high}, "
                         f"got {_shown(value)}")
    return value


def _seconds(body: Dict[str, Any], name: str):
    if name not in body:
        raise BadRequest(f"field '{name}' is missing (null before anything is measured)")
    value = body[name]
    if value is None:
        return None
    # compared as they are: float() of a huge integer would overflow
    if not isinstance(value, (int, float)) or isinstance(value, bool) \
            or not 0 < value <= MAX_SECONDS:  # NaN fails this too
        raise BadRequest(f"field '{name}' must be a positive number of seconds (at most "
                         f"{MAX_SECONDS:g}) or null, got {_shown(value)}")
    return float(value)


def _query_integer(request: HttpRequest, name: str, default: int, low: int,
                   high: int) -> int:
    raw = request.GET.get(name)
    if raw is None:
        return default
    if not (re.fullmatch(r"[0-9]{1,10}", raw) and low <= int(raw) <= high):
        raise BadRequest(f"query parameter '{name}' must be an integer in {low}..{high}, "
                         f"got {_shown(raw)}")
    return int(raw)


def _job_name(job: str) -> str:
    if not JOB_NAME.fullmatch(job):
        raise BadRequest(f"job id {_shown(job)} must be 1 to 64 letters, digits, '.', '_' "
                         f"or '-'")
    return job


def _find(job: str, lock: bool = False) -> Job:
    jobs = Job.objects.select_for_update() if lock else Job.objects
    try:
        return jobs.get(name=_job_name(job))
    except Job.DoesNotExist:
        raise BadRequest(f"no job {job!r} here; its worker 0 initialises it with "
                         f"POST /jobs/{job}/", 404) from None


def _for_budget(job: str) -> Tuple[Job, List[Device]]:
    """The job and its devices in rank order, locked for the write (database.select)."""
    jobs = select(Job, lock=True, name=_job_name(job))
    if not jobs:
        _find(job)  # its 404
    return jobs[0], select(Device, order_by="rank", lock=True, job_id=jobs[0].pk)


# --- answers ---------------------------------------------------------------------------
def _device_state(device: Device, job_round: int, now) -> Dict[str, Any]:
    return {
        "rank": device.rank,
        "round": device.round,
        # whether it counts among the devices the budgets follow
        # (esync.algorithms.esync.budget.living)
        "living": budget_rule.living(device.round, job_round),
        "budget": device.budget,
        "measuring": device.measuring,
        # rounds in a row sat out (esync.algorithms.esync.budget.remeasures)
        "rounds_out": device.rounds_out,
        "times_reported": device.times_reported,
        "time_per_iteration": device.last_time,
        "smoothed_time_per_iteration": device.smoothed_time,
        "coordination": device.last_coordination,
        "smoothed_coordination": device.smoothed_coordination,
        "reports": device.reports,
        "reported_at": device.reported_at.isoformat() if device.reported_at else None,
        "seconds_since_report": round((now - device.reported_at).total_seconds(), 3)
        if device.reported_at else None,
    }


def _job_state(job: Job) -> Dict[str, Any]:
    now = timezone.now()
    return {
        "job": job.name,
        "workers": job.num_workers,
        "max_local_steps": job.max_local_steps,
        "round_time": job.round_time,
        "coordination_share": job.coordination_share,
        "least_speed": job.least_speed,
        "round": job.round,
        "created_at": job.created_at.isoformat(),
        "updated_at": job.updated_at.isoformat(),
        # .all(), sorted here: uses the devices prefetched for a page of the status
        "devices": [_device_state(d, job.round, now)
                    for d in sorted(job.devices.all(), key=lambda d: d.rank)],
    }


# --- views -----------------------------------------------------------------------------
@api("GET")
def status(request: HttpRequest) -> JsonResponse:
    """A page of the state: jobs in the order they were created, from `offset`, at most
    `limit` of them and, past the first, no more than PAGE_DEVICES devices; `total` is
    the number of jobs and `next_offset` where the next page begins (null: none)."""
    limit = _query_integer(request, "limit", STATUS_LIMIT, 1, STATUS_MAX_LIMIT)
    offset = _query_integer(request, "offset", 0, 0, MAX_INT)
    total = Job.objects.count()
    ids, devices = [], 0
    for id_, workers in Job.objects.values_list("id", "num_workers")[offset:offset + limit]:
        if ids and devices + workers > PAGE_DEVICES:
            break
        ids.append(id_)
        devices += workers
    jobs = Job.objects.filter(id__in=ids).prefetch_related("devices")
    end = offset + len(ids)
    return JsonResponse({"jobs": [_job_state(j) for j in jobs], "total": total,
                         "offset": offset, "limit": limit,
                         "next_offset": end if end < total else None})


@api("GET", "POST")
def job(request: HttpRequest, job: str) -> JsonResponse:
    """GET: one job's state. POST: initialise it (again, with the same settings: no-op),
    and with `resume_round` r rewind it to r - 1 (see _rewind)."""
    if request.method == "GET":
        return JsonResponse(_job_state(_find(job)))
    name = _job_name(job)
    body = _body(request)
    workers = _integer(body, "workers", 1, MAX_WORKERS)
    cap = _integer(body, "max_local_steps", 1, MAX_LOCAL_STEPS) \
        if "max_local_steps" in body else config.MAX_LOCAL_STEPS
    resume = _integer(body, "resume_round", 1) if "resume_round" in body else None
    round_time = _round_time(body)
    share = _share(body, "coordination_share", high_open=True)
    least = _share(body, "least_speed", high_open=False)
    with writing():
        existing = Job.objects.select_for_update().filter(name=name).first()
        if existing is not None:
            if (existing.num_workers, existing.max_local_steps, existing.round_time,
                    existing.coordination_share, existing.least_speed) != \
                    (workers, cap, round_time, share, least):
                raise BadRequest(f"job {name!r} already exists with {existing.num_workers} "
                                 f"workers, max_local_steps {existing.max_local_steps}, "
                                 f"round_time {existing.round_time}, coordination_share "
                                 f"{existing.coordination_share:g} and least_speed "
                                 f"{existing.least_speed:g}")
            if resume is not None:
                _rewind(existing, resume)
            return JsonResponse(_job_state(existing))
        # a new job has nothing to rewind: every round is 0
        created = Job.objects.create(name=name, num_workers=workers, max_local_steps=cap,
                                     round_time=round_time, coordination_share=share,
                                     least_speed=least)
        Device.objects.bulk_create(Device(job=created, rank=r) for r in range(workers))
    log.info("job %s: %d workers, at most %d local iterations a round", name, workers, cap)
    return JsonResponse(_job_state(created), status=201)


def _round_time(body) -> Optional[float]:
    """The optional field 'round_time': seconds in (0, MAX_ROUND_TIME], or null/absent
    (the slowest device sets the round)."""
    value = body.get("round_time")
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or \
            not 0 < value <= MAX_ROUND_TIME:
        raise BadRequest(f"field 'round_time' must be a number of seconds in "
                         f"(0, {MAX_ROUND_TIME}] or null")
    return float(value)


def _share(body, field: str, high_open: bool) -> float:
    """The optional field `field` ('coordination_share': a number in [0, 1);
    'least_speed': in [0, 1]), absent: 0 (the paper's rule)."""
    value = body.get(field, 0.0)
    bound = "[0, 1)" if high_open else "[0, 1]"
    if not isinstance(value, (int, float)) or isinstance(value, bool) or \
            not (0 <= value < 1 if high_open else 0 <= value <= 1):
        raise BadRequest(f"field {field!r} must be a number in {bound}, got {_shown(value)}")
    return float(value)


def _rewind(job: Job, resume: int) -> None:
    """A job resumed from a checkpoint asks again for rounds from `resume` on, which its
    devices may have asked for before: every round (the job's, each device's) above
    resume - 1 becomes resume - 1. Times, budgets and report counts stay."""
    last = resume - 1
    rewound = Device.objects.filter(job=job, round__gt=last).update(round=last)
    if job.round > last:
        job.round = last
        job.planned_round = 0  # the rounds asked again are planned again
        job.save(update_fields=["round", "planned_round", "updated_at"])
    log.info("job %s resumed at round %d (%d devices rewound)", job.name, resume, rewound)


def _check_ahead(job: Job, round_: int) -> None:
    """A round at most MAX_ROUNDS_AHEAD beyond the job's latest; any, while no round was
    asked for (a job resumed on a state server that lost its rows starts at its
    checkpoint's round)."""
    if job.round > 0 and round_ > job.round + MAX_ROUNDS_AHEAD:
        raise BadRequest(f"field 'round' must be an integer in 1..{job.round + MAX_ROUNDS_AHEAD}"
                         f" (at most {MAX_ROUNDS_AHEAD} beyond round {job.round}, the latest "
                         f"any worker of job {job.name!r} asked for), got {_shown(round_)}")


def _planned(job: Job, round_: int, ranks: List[int], times, cost: Optional[float]):
    """The round's length, the same for every device of the round: fixed by its first
    request once every device has measured, kept while the same devices (`ranks`, in the
    order of `times`) train (esync.algorithms.esync.budget.plan)."""
    planned = budget_rule.plan(times, job.max_local_steps, job.round_time, cost,
                               job.coordination_share, job.least_speed)
    if planned is None:
        return None
    trainers = ",".join(str(ranks[i]) for i in planned.trainers)
    if job.planned_round == round_ and job.planned_trainers == trainers:
        return budget_rule.Plan(job.planned_seconds, job.planned_whole, planned.trainers)
    job.planned_round, job.planned_trainers = round_, trainers
    job.planned_seconds, job.planned_whole = planned.seconds, planned.whole
    job.save(update_fields=["planned_round", "planned_trainers", "planned_seconds",
                            "planned_whole", "updated_at"])
    return planned


@api("POST")
def budget(request: HttpRequest, job: str) -> JsonResponse:
    """A worker reports its time per local iteration and gets this round's budget."""
    body = _body(request)
    opened = False  # a retry's round is not open: the budget given holds
    rank = _integer(body, "rank", 0)
    round_ = _integer(body, "round", 1)
    measured = _seconds(body, "time_per_iteration")
    coordination = _seconds(body, "coordination") if "coordination" in body else None
    interim = body.get("interim", False)
    if not isinstance(interim, bool):
        raise BadRequest(f"field 'interim' must be true or false, got {_shown(interim)}")
    with writing():
        found, devices = _for_budget(job)
        if rank >= found.num_workers:
            raise BadRequest(f"field 'rank' {rank} is outside job {found.name!r}, which has "
                             f"ranks 0..{found.num_workers - 1}")
        device = devices[rank]
        _check_ahead(found, round_)
        if round_ < device.round:
            raise BadRequest(f"field 'round' {round_} is in the past: rank {rank} already "
                             f"asked for round {device.round} (a job resumed from an "
                             f"earlier round says so first: 'resume_round' in "
                             f"POST /jobs/{found.name}/)")
        if interim:  # the time so far of the round it asked for last (an open one)
            if round_ != device.round or measured is None:
                raise BadRequest(f"an interim report is a time (not null) for round "
                                 f"{device.round}, the last rank {rank} asked for; got "
                                 f"round {round_}")
            device.last_time = measured  # replaces its first, a warm-up (budget.opens)
            device.smoothed_time = measured
            device.save(update_fields=["last_time", "smoothed_time"])
        elif round_ > device.round:  # the same round again is a retry: same answer
            if measured is not None:  # null: it computed nothing (sat out)
                device.times_reported += 1
                device.last_time = measured
                # measured again after rounds out: its average is of the device before;
                # its second time: its first was one iteration, a warm-up
                device.smoothed_time = budget_rule.smooth(
                    device.smoothed_time, measured, settings.BUDGET_SMOOTHING,
                    fresh=device.rounds_out > 0 or device.times_reported == 2)
            if coordination is not None:
                device.last_coordination = coordination
                device.smoothed_coordination = budget_rule.smooth(
                    device.smoothed_coordination, coordination, settings.BUDGET_SMOOTHING)
            # the slowest living device sets the pace: dead ones stopped asking
            latest = max(found.round, round_)
            counted = [d for d in devices
                       if d.rank == rank or budget_rule.living(d.round, latest)]
            costs = [d.smoothed_coordination for d in counted
                     if d.smoothed_coordination is not None]
            times = [d.smoothed_time for d in counted]
            cost = max(costs) if costs else None
            device.budget = budget_rule.budget(
                device.smoothed_time, times, found.max_local_steps, found.round_time,
                cost, found.coordination_share, found.least_speed,
                planned=_planned(found, round_, [d.rank for d in counted], times, cost))
            if device.budget and device.reports == 1 and found.least_speed:
                # its first round after measuring itself: one that others measured before
                # it began, as long as they were told, ends with theirs (budget.filling)
                now = timezone.now()
                left = budget_rule.round_left([
                    ((now - d.reported_at).total_seconds(), d.budget, d.smoothed_time)
                    for d in counted if d.rank != rank and d.round == round_ and
                    d.budget and d.smoothed_time is not None and d.reported_at])
                if left is not None:
                    device.budget = budget_rule.filling(left, device.smoothed_time,
                                                        found.max_local_steps)
            device.measuring = budget_rule.measuring(device.smoothed_time,
                                                     found.least_speed)
            opened = budget_rule.opens(device.smoothed_time, times, device.budget,
                                       found.least_speed)
            device.rounds_out = device.rounds_out + 1 if device.budget == 0 else 0
            if device.rounds_out and not device.measuring:  # sat out: measure again?
                fits = device.smoothed_time <= budget_rule.round_computing(
                    times, found.max_local_steps, found.round_time, cost,
                    found.coordination_share, found.least_speed)
                far = budget_rule.far_below(device.smoothed_time, times,
                                            found.least_speed)
                if budget_rule.remeasures(device.rounds_out, fits,
                                          warm_up=device.times_reported == 1, far=far):
                    device.budget, device.measuring = 1, True
            device.round = round_
            device.reports += 1
            device.reported_at = timezone.now()
            device.save(update_fields=ANSWERED)
            if round_ > found.round:
                found.round = round_
                found.save(update_fields=["round", "updated_at"])
    return JsonResponse({"job": found.name, "rank": rank, "round": round_,
                         "budget": device.budget, "measuring": device.measuring,
                         "open": opened,
                         "smoothed_time_per_iteration": device.smoothed_time})


# --- errors outside the views (unknown URL, crash) -------------------------------------
def bad_request(request, exception=None) -> JsonResponse:
    """Django's refusals outside the views: a Host header not allowed or not a host
    name, a query string of too many fields, ..."""
    reason = str(exception)[:200] if exception is not None and str(exception) else ""
    return _error(f"bad request: {reason}" if reason else "bad request", 400)


def not_found(request, exception=None) -> JsonResponse:
    return _error(f"no such endpoint: {_shown(request.path)}; see GET /status/, GET /jobs/, "
                  f"POST /jobs/<job>/, POST /jobs/<job>/budget/ and "
                  f"POST /jobs/<job>/report/", 404)


def server_error(request) -> JsonResponse:
    return _error("internal error of the state server (see its log)", 500)
