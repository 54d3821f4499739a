"""The live job page: what every process of a running job reports, as a page that
refreshes itself and as JSON.

    POST /jobs/<job>/report/   a process's report (fields: budgets.report); the first
                               report of a job makes it. A write: with
                               ESYNC_STATE_TOKEN set, it needs `Authorization: Bearer
                               <token>` (401 without, 403 with another token)
    GET  /jobs/                the jobs, newest first (HTML; JSON with
                               `Accept: application/json`)
    GET  /jobs/<job>/          in a browser (`Accept: text/html`): the job's page, its
                               devices as a table and charts of the metric, samples per
                               second, budgets (or rounds) and traffic over time; it
                               reloads its live part every REFRESH_S seconds. Other
                               clients get the budget API's JSON (budgets.views)
    GET  /jobs/<job>/live/     the page's figures as JSON: the job's state, each
                               process's latest report with its state, and the series
                               the charts draw (`?points=0`: without them)

Every process of a job started by a launcher reports, in every mode: each worker, the
evaluator and the launcher (esync.logs.live sends them, once something changed and at
least every 4 s, to the URL in ESYNC_LIVE_URL). A job of the budget API that nobody
reports for (ESync workers started by hand without ESYNC_LIVE_URL) shows its devices'
budgets from the budget API.

A process is "running" while it reports; "silent" once it has not for STALE_S seconds;
"done" after its last report (alive: false). A launcher's report of its processes says
which died ("exited N"). The job is the launcher's word (running, finished, failed) and
"stopped" once its launcher is silent, or, without a launcher, while every process is
silent or done. Reads are open, as GET /status/ is; a bad report gets a 4xx naming the
field and changes nothing.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from budgets.database import count, select, writing
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

from budgets import charts, views
from budgets.models import Device, Job, LiveJob, Point, Reporter
from budgets.report import BadReport, read_report
from budgets.templatetags.livepage import OTHER, PHASE_COLOURS
from budgets.views import BadRequest, _body, _job_name, _query_integer, api
from esync.algorithms.esync import budget as budget_rule

#: seconds after which a process that stopped reporting is "silent" (it reports once
#: something changed, at most every second, and at least every 4 s: esync.logs.live)
STALE_S = 10.0
#: seconds between two reloads of a page's live part
REFRESH_S = 2
#: points kept per process for the charts: past this, every other older one goes
MAX_POINTS = 240
#: devices drawn in the per-device charts (the table lists them all)
CHART_DEVICES = 12
#: what a point keeps of a report, for the charts
POINT_FIELDS = ("round", "budget", "samples_per_second", "bytes_sent", "bytes_received",
                "metric")
PHASE_LEGEND = [*PHASE_COLOURS.items(), ("other", OTHER)]
#: jobs listed on GET /jobs/
LIST_LIMIT = 200


# --- reports ---------------------------------------------------------------------------
@api("POST")
def report(request: HttpRequest, job: str) -> JsonResponse:
    """Keep a process's report (budgets.report), making the job at its first."""
    name = _job_name(job)
    try:
        figures = read_report(_body(request))
    except BadReport as e:
        raise BadRequest(str(e)) from None
    role, rank = figures["role"], figures.get("rank", 0)
    now = timezone.now()
    with writing():  # a worker's report, every second: database.select, not the ORM
        live = next(iter(select(LiveJob, lock=True, name=name)), None) or \
            LiveJob.objects.get_or_create(name=name)[0]
        if figures.get("mode") and live.mode != figures["mode"]:
            live.mode = figures["mode"]
        live.reported_at = now
        live.save(update_fields=["mode", "reported_at"])
        reporter = next(iter(select(Reporter, lock=True, job_id=live.pk, role=role,
                                    rank=rank)), None) or \
            Reporter.objects.get_or_create(job=live, role=role, rank=rank)[0]
        reporter.figures = json.dumps(figures)
        reporter.reports += 1
        reporter.reported_at = now
        reporter.save(update_fields=["figures", "reports", "reported_at"])
        if role != "launcher":
            _add_point(reporter, (now - live.created_at).total_seconds(), figures)
    return JsonResponse({"job": name, "role": role, "rank": rank,
                         "reports": reporter.reports}, status=202)


def _add_point(reporter: Reporter, seconds: float, figures: Dict[str, Any]) -> None:
    kept = {k: figures[k] for k in POINT_FIELDS if k in figures}
    Point.objects.create(reporter=reporter, seconds=seconds, figures=json.dumps(kept))
    if count(Point, reporter_id=reporter.pk) > MAX_POINTS:
        ids = list(Point.objects.filter(reporter=reporter).order_by("seconds")
                   .values_list("id", flat=True))
        # every other one of all but the newest: the whole run stays, at half the detail
        Point.objects.filter(id__in=ids[1:-1:2]).delete()


# --- a job's state, as the page and its JSON show it -----------------------------------
def _process_state(reporter: Reporter, figures: Dict[str, Any], now,
                   processes: Dict[str, str]) -> str:
    said = processes.get(f"worker{reporter.rank}" if reporter.role == "worker"
                         else reporter.role)
    if said and not said.startswith("running"):
        return "dead" if said.startswith(("exited", "killed")) else said
    if figures.get("alive") is False:
        return "done"
    if (now - reporter.reported_at).total_seconds() > STALE_S:
        return "silent"
    return "running"


def _job_state(launcher: Optional[Dict[str, Any]], reporters: List[Dict[str, Any]]) -> str:
    if launcher is not None:
        said = launcher["figures"].get("state", "running")
        if said == "running" and launcher["state"] != "running":
            return "stopped"
        return said
    return "running" if any(r["state"] == "running" for r in reporters) else "stopped"


def _reporter_row(reporter: Reporter, now, processes: Dict[str, str]) -> Dict[str, Any]:
    figures = json.loads(reporter.figures)
    age = (now - reporter.reported_at).total_seconds()
    phases = figures.get("breakdown") or {}
    whole = sum(phases.values())
    return {"role": reporter.role, "rank": reporter.rank, "figures": figures,
            "reports": reporter.reports, "seconds_since_report": round(age, 3),
            "state": _process_state(reporter, figures, now, processes),
            # each phase's share of the round, for the table's bar
            "shares": [(k, v, 100.0 * v / whole) for k, v in phases.items()] if whole else []}


def _budget_rows(job: Job, now) -> List[Dict[str, Any]]:
    """An ESync job's devices as the budget API knows them (nobody reports for it): a
    device is running while it asks for budgets, in step with the others."""
    rows = []
    for device in Device.objects.filter(job=job).order_by("rank"):
        age = (now - device.reported_at).total_seconds() if device.reported_at else None
        running = age is not None and age <= STALE_S and \
            budget_rule.living(device.round, job.round)
        rows.append({"role": "worker", "rank": device.rank, "reports": device.reports,
                     "figures": {"round": device.round, "budget": device.budget,
                                 "mode": "esync"},
                     "seconds_since_report": None if age is None else round(age, 3),
                     "shares": [], "state": "running" if running else "silent"})
    return rows


def live_state(name: str, points: bool = True) -> Dict[str, Any]:
    """The job's state as GET /jobs/<job>/live/ gives it; BadRequest 404 if neither a
    live job nor a budget job has that name."""
    now = timezone.now()
    live = LiveJob.objects.filter(name=name).first()
    budget_job = Job.objects.filter(name=name).first()
    if live is None and budget_job is None:
        raise BadRequest(f"no job {name!r} here: none of its processes has reported (they "
                         f"do with ESYNC_LIVE_URL set; the launchers set it)", 404)
    reporters = list(live.reporters.all()) if live is not None else []
    launcher_row = next((r for r in reporters if r.role == "launcher"), None)
    processes = json.loads(launcher_row.figures).get("processes", {}) \
        if launcher_row else {}
    rows = [_reporter_row(r, now, processes) for r in reporters]
    workers = sorted((r for r in rows if r["role"] == "worker"), key=lambda r: r["rank"])
    if not rows and budget_job is not None:
        workers = _budget_rows(budget_job, now)
    launcher = next((r for r in rows if r["role"] == "launcher"), None)
    evaluator = next((r for r in rows if r["role"] == "evaluator"), None)
    created = live.created_at if live is not None else budget_job.created_at
    job_state = _job_state(launcher, rows or workers)
    # a job that ended: how long it ran (to its last report), not how long ago it began
    last = live.reported_at if live is not None else budget_job.updated_at
    state = {
        "job": name,
        "mode": (live.mode if live is not None else "") or ("esync" if budget_job else ""),
        "state": job_state,
        "seconds": round(((now if job_state == "running" else last) - created)
                         .total_seconds(), 3),
        "workers": workers, "evaluator": evaluator, "launcher": launcher,
        "metric": _metric(evaluator, workers),
    }
    if points:
        state["series"] = _series(reporters, workers, evaluator)
    return state


def _metric(evaluator, workers) -> Optional[Dict[str, Any]]:
    """The latest evaluation: the evaluator's, or else worker 0's."""
    for row in [evaluator, *workers[:1]]:
        if row is not None and "metric" in row["figures"]:
            return {"name": row["figures"].get("metric_name", "metric"),
                    "value": row["figures"]["metric"], "round": row["figures"].get("round")}
    return None


def _series(reporters: List[Reporter], workers, evaluator) -> Dict[str, Any]:
    """Per process drawn, its points: [seconds, {figures}], oldest first."""
    drawn = {("worker", w["rank"]) for w in workers[:CHART_DEVICES]}
    if evaluator is not None:
        drawn.add(("evaluator", 0))
    ids = {r.id: r for r in reporters if (r.role, r.rank) in drawn}
    series: Dict[str, list] = {}
    for reporter_id, seconds, figures in Point.objects.filter(reporter_id__in=ids) \
            .order_by("seconds").values_list("reporter_id", "seconds", "figures"):
        r = ids[reporter_id]
        key = "evaluator" if r.role == "evaluator" else f"worker{r.rank}"
        series.setdefault(key, []).append([round(seconds, 3), json.loads(figures)])
    return series


# --- pages -----------------------------------------------------------------------------
def wants_html(request: HttpRequest) -> bool:
    """A browser's GET: its Accept header asks for HTML (scripts' and the workers' ask for
    JSON or anything, and get JSON as before)."""
    return "text/html" in request.META.get("HTTP_ACCEPT", "")


def _charts(state: Dict[str, Any]) -> List[str]:
    series = state.get("series", {})
    workers = state["workers"]
    shown = workers[:CHART_DEVICES]
    note = f"{len(shown)} of {len(workers)} devices" if len(workers) > len(shown) else ""
    label = {f"worker{w['rank']}": f"{w['rank']}: {w['figures'].get('device', '')}"
             for w in shown}

    def per_device(field: str, rate: bool = False) -> List[charts.Series]:
        drawn = []
        for key in label:
            points = [(t, f[field]) for t, f in series.get(key, []) if field in f]
            if rate:  # a count so far -> its rate between two points
                points = [(t1, (v1 - v0) / (t1 - t0)) for (t0, v0), (t1, v1)
                          in zip(points, points[1:]) if t1 > t0 and v1 >= v0]
            drawn.append((label[key], points))
        return drawn

    metric = state["metric"]
    source = "evaluator" if "evaluator" in series else "worker0"
    metric_points = [(t, f["metric"]) for t, f in series.get(source, []) if "metric" in f]
    budgets = any("budget" in w["figures"] for w in workers)
    traffic = per_device("bytes_sent", rate=True)
    return [
        charts.line_chart(metric["name"] if metric else "metric",
                          [(source, metric_points)]),
        charts.line_chart("samples per second", per_device("samples_per_second"),
                          note=note),
        charts.line_chart("budget", per_device("budget"), "local iterations", note) if budgets
        else charts.line_chart("round", per_device("round"), note=note),
        charts.line_chart("sent", traffic, "bytes per second", note),
    ]


def page(request: HttpRequest, job: str) -> HttpResponse:
    """The job's page (GET /jobs/<job>/ from a browser); `?part=live`: its live part
    alone, which the page fetches every REFRESH_S seconds."""
    try:
        state = live_state(_job_name(job))
    except BadRequest as e:
        return render(request, "budgets/missing.html", {"job": job, "error": str(e)},
                      status=e.status)
    context = {"state": state, "charts": _charts(state), "refresh_s": REFRESH_S,
               "stale_s": STALE_S, "phase_colours": PHASE_LEGEND}
    if request.GET.get("part") == "live":
        return render(request, "budgets/live.html", context)
    return render(request, "budgets/job.html", context)


@api("GET")
def live_json(request: HttpRequest, job: str) -> JsonResponse:
    """GET /jobs/<job>/live/: the page's figures (see the module's docstring)."""
    points = _query_integer(request, "points", 1, 0, 1)
    return JsonResponse(live_state(_job_name(job), points=bool(points)))


def _listed() -> List[Dict[str, Any]]:
    names = {j.name: j for j in LiveJob.objects.order_by("-created_at")[:LIST_LIMIT]}
    for j in Job.objects.order_by("-created_at")[:LIST_LIMIT]:
        names.setdefault(j.name, j)
    listed = []
    for name, j in names.items():
        state = live_state(name, points=False)
        listed.append({"job": name, "mode": state["mode"], "state": state["state"],
                       "workers": len(state["workers"]), "seconds": state["seconds"],
                       "metric": state["metric"], "created_at": j.created_at})
    listed.sort(key=lambda j: j["created_at"], reverse=True)
    return listed[:LIST_LIMIT]


@api("GET")
def jobs(request: HttpRequest) -> HttpResponse:
    """GET /jobs/: the jobs, newest first, at most LIST_LIMIT."""
    listed = _listed()
    if wants_html(request):
        part = request.GET.get("part") == "live"
        return render(request, "budgets/joblist.html" if part else "budgets/jobs.html",
                      {"jobs": listed, "refresh_s": REFRESH_S})
    for j in listed:
        j["created_at"] = j["created_at"].isoformat()
    return JsonResponse({"jobs": listed})


def job(request: HttpRequest, job: str) -> HttpResponse:
    """/jobs/<job>/: a browser's GET gets the page; everything else the budget API."""
    if request.method == "GET" and wants_html(request):
        return page(request, job)
    return views.job(request, job=job)
