"""The budget API: JSON over HTTP (documented in the project README).

    GET  /  or  /status/       every job's state
    POST /jobs/<job>/          {"workers": N, "max_local_steps": M}: initialise a job
    GET  /jobs/<job>/          one job's state
    POST /jobs/<job>/budget/   {"rank": r, "round": t, "time_per_iteration": s or null}:
                               report and get this round's budget

A bad request gets HTTP 400 (unknown job: 404; wrong method: 405) with
{"error": "..."} naming the field, and changes nothing.
"""
from __future__ import annotations

import json
import logging
import math
import re
from typing import Any, Dict

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.utils import timezone

import config

from budgets import rule
from budgets.models import Device, Job

log = logging.getLogger("budgets")

JOB_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_WORKERS = 100_000


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
def _body(request: HttpRequest) -> Dict[str, Any]:
    try:
        body = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _integer(body: Dict[str, Any], name: str, low: int, high: int = 2**31 - 1) -> int:
    if name not in body:
        raise BadRequest(f"field '{name}' is missing")
    value = body[name]
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(f"field '{name}' must be an integer in {low}..{high}, got {value!r}")
    return value


def _seconds(body: Dict[str, Any], name: str):
    if name not in body:
        raise BadRequest(f"field '{name}' is missing (null before anything is measured)")
    value = body[name]
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) \
            or not math.isfinite(value) or value <= 0:
        raise BadRequest(f"field '{name}' must be a positive number of seconds or null, "
                         f"got {value!r}")
    return float(value)


def _job_name(job: str) -> str:
    if not JOB_NAME.fullmatch(job):
        raise BadRequest(f"job id {job!r} must be 1 to 64 letters, digits, '.', '_' or '-'")
    return job


def _find(job: str, lock: bool = False) -> Job:
    jobs = Job.objects.select_for_update() if lock else Job.objects
    try:
        return jobs.get(name=_job_name(job))
    except Job.DoesNotExist:
        raise BadRequest(f"no job {job!r} here; its worker 0 initialises it with "
                         f"POST /jobs/{job}/", 404) from None


# --- answers ---------------------------------------------------------------------------
def _device_state(device: Device, now) -> Dict[str, Any]:
    return {
        "rank": device.rank,
        "round": device.round,
        "budget": device.budget,
        "time_per_iteration": device.last_time,
        "smoothed_time_per_iteration": device.smoothed_time,
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
        "round": job.round,
        "created_at": job.created_at.isoformat(),
        "updated_at": job.updated_at.isoformat(),
        "devices": [_device_state(d, now) for d in job.devices.order_by("rank")],
    }


# --- views -----------------------------------------------------------------------------
@api("GET")
def status(request: HttpRequest) -> JsonResponse:
    """The whole state: every job, its round, and each device's time and budget."""
    jobs = Job.objects.prefetch_related("devices")
    return JsonResponse({"jobs": [_job_state(j) for j in jobs]})


@api("GET", "POST")
def job(request: HttpRequest, job: str) -> JsonResponse:
    """GET: one job's state. POST: initialise it (again, with the same settings: no-op)."""
    if request.method == "GET":
        return JsonResponse(_job_state(_find(job)))
    name = _job_name(job)
    body = _body(request)
    workers = _integer(body, "workers", 1, MAX_WORKERS)
    cap = _integer(body, "max_local_steps", 1, 1_000_000) if "max_local_steps" in body \
        else config.MAX_LOCAL_STEPS
    with transaction.atomic():
        existing = Job.objects.select_for_update().filter(name=name).first()
        if existing is not None:
            if (existing.num_workers, existing.max_local_steps) != (workers, cap):
                raise BadRequest(f"job {name!r} already exists with {existing.num_workers} "
                                 f"workers and max_local_steps {existing.max_local_steps}")
            return JsonResponse(_job_state(existing))
        created = Job.objects.create(name=name, num_workers=workers, max_local_steps=cap)
        Device.objects.bulk_create(Device(job=created, rank=r) for r in range(workers))
    log.info("job %s: %d workers, at most %d local iterations a round", name, workers, cap)
    return JsonResponse(_job_state(created), status=201)


@api("POST")
def budget(request: HttpRequest, job: str) -> JsonResponse:
    """A worker reports its time per local iteration and gets this round's budget."""
    body = _body(request)
    rank = _integer(body, "rank", 0)
    round_ = _integer(body, "round", 1)
    measured = _seconds(body, "time_per_iteration")
    with transaction.atomic():
        found = _find(job, lock=True)
        if rank >= found.num_workers:
            raise BadRequest(f"field 'rank' {rank} is outside job {found.name!r}, which has "
                             f"ranks 0..{found.num_workers - 1}")
        devices = list(found.devices.order_by("rank"))
        device = devices[rank]
        if round_ < device.round:
            raise BadRequest(f"field 'round' {round_} is in the past: rank {rank} already "
                             f"asked for round {device.round}")
        if round_ > device.round:  # the same round again is a retry: same answer
            if measured is not None:
                device.last_time = measured
                device.smoothed_time = rule.smooth(device.smoothed_time, measured,
                                                   settings.BUDGET_SMOOTHING)
            device.budget = rule.budget(device.smoothed_time,
                                        [d.smoothed_time for d in devices],
                                        found.max_local_steps)
            device.round = round_
            device.reports += 1
            device.reported_at = timezone.now()
            device.save()
            if round_ > found.round:
                found.round = round_
                found.save(update_fields=["round", "updated_at"])
    return JsonResponse({"job": found.name, "rank": rank, "round": round_,
                         "budget": device.budget,
                         "smoothed_time_per_iteration": device.smoothed_time})


# --- errors outside the views (unknown URL, crash) -------------------------------------
def bad_request(request, exception=None) -> JsonResponse:
    return _error("bad request", 400)


def not_found(request, exception=None) -> JsonResponse:
    return _error(f"no such endpoint: {request.path}; see GET /status/, POST /jobs/<job>/ "
                  f"and POST /jobs/<job>/budget/", 404)


def server_error(request) -> JsonResponse:
    return _error("internal error of the state server (see its log)", 500)
