"""The state server's whole state: jobs and, per job, one row per worker (device).

Everything lives in the database and changes inside transactions, so several server
processes behind one port see one state, and a restart of the server loses nothing.
"""
from django.db import models


class Job(models.Model):
    """One training job, initialised by its worker 0 with the number of workers."""

    name = models.CharField(max_length=64, unique=True)
    num_workers = models.PositiveIntegerField()
    max_local_steps = models.PositiveIntegerField()
    # seconds a round should take (--round-time); null: the slowest living device's
    # time per local iteration sets the round (the paper's rule)
    round_time = models.FloatField(null=True)
    # the most of a round its synchronisation may take (--coordination-share): rounds
    # are made long enough (esync.algorithms.esync.budget); 0: the paper's rule
    coordination_share = models.FloatField(default=0.0)
    # the least speed, as a share of the fastest living device's, at which a device
    # trains (--least-speed): slower ones get budget 0; 0: every device trains
    least_speed = models.FloatField(default=0.0)
    round = models.PositiveIntegerField(default=0)  # the latest round any worker asked for
    # the round whose length was fixed by its first request, every device measured, the
    # ranks that train in it (comma-separated) and that length
    # (esync.algorithms.esync.budget.plan): every device of the round gets it
    planned_round = models.PositiveIntegerField(default=0)
    planned_trainers = models.TextField(default="", blank=True)
    planned_seconds = models.FloatField(null=True)
    planned_whole = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "name"]

    def __str__(self) -> str:
        return self.name


class Device(models.Model):
    """A worker of a job: what it last reported and the budget it was given."""

    job = models.ForeignKey(Job, related_name="devices", on_delete=models.CASCADE)
    rank = models.PositiveIntegerField()
    round = models.PositiveIntegerField(default=0)  # the last round it asked a budget for
    last_time = models.FloatField(null=True)  # seconds per local iteration, as reported
    smoothed_time = models.FloatField(null=True)  # the moving average the budget uses
    # seconds its last synchronisation cost (push and pull less waiting, budget wait),
    # as reported, and their moving average
    last_coordination = models.FloatField(null=True)
    smoothed_coordination = models.FloatField(null=True)
    budget = models.PositiveIntegerField(default=1)
    # the budget's round measures speeds: the device's delta weighs nothing
    # (esync.algorithms.esync.budget.measuring)
    measuring = models.BooleanField(default=False)
    # rounds in a row it has sat out (budget 0), for when it measures again
    # (esync.algorithms.esync.budget.remeasures)
    rounds_out = models.PositiveIntegerField(default=0)
    # times it reported (not null; interim ones not counted): 1, its first iteration's,
    # a warm-up (esync.algorithms.esync.budget.remeasures)
    times_reported = models.PositiveIntegerField(default=0)
    reports = models.PositiveIntegerField(default=0)
    reported_at = models.DateTimeField(null=True)

    class Meta:
        ordering = ["job", "rank"]
        constraints = [models.UniqueConstraint(fields=["job", "rank"], name="one_row_per_rank")]

    def __str__(self) -> str:
        return f"{self.job.name}/{self.rank}"


class LiveJob(models.Model):
    """A job on the live page (/jobs/<job>/): made by the first report of any of its
    processes, in any mode (budgets.live)."""

    name = models.CharField(max_length=64, unique=True)
    mode = models.CharField(max_length=32, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    reported_at = models.DateTimeField(auto_now=True)  # the latest report of any process

    class Meta:
        ordering = ["created_at", "name"]

    def __str__(self) -> str:
        return self.name


class Reporter(models.Model):
    """A process of a live job (a worker, the evaluator, the launcher) and what it said
    last: a checked report (budgets.report), as JSON."""

    job = models.ForeignKey(LiveJob, related_name="reporters", on_delete=models.CASCADE)
    role = models.CharField(max_length=16)
    rank = models.IntegerField(default=0)  # a worker's; 0 for the others
    figures = models.TextField(default="{}")
    reports = models.PositiveIntegerField(default=0)
    reported_at = models.DateTimeField(null=True)

    class Meta:
        ordering = ["job", "role", "rank"]
        constraints = [models.UniqueConstraint(fields=["job", "role", "rank"],
                                               name="one_row_per_process")]


class Point(models.Model):
    """One report's figures for the page's charts, at `seconds` after the job's first
    report (the state server's clock: one clock for every process). Thinned out as they
    grow (budgets.live.MAX_POINTS a process)."""

    reporter = models.ForeignKey(Reporter, related_name="points", on_delete=models.CASCADE)
    seconds = models.FloatField()
    figures = models.TextField()

    class Meta:
        ordering = ["reporter", "seconds"]
