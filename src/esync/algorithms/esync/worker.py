"""ESync (Li et al.) on the worker: a budget of local SGD steps per round, then the
model delta is averaged synchronously.

For round t the worker reports its measured time per local iteration to the state
server and gets its budget K: the slowest device runs 1 local iteration, a device k
times faster about k, so that all reach the aggregation together. It also reports what
its last synchronisation cost (`coordination`: the push and pull less the wait for the
others, plus its wait for the budget); where that would take more than
--coordination-share of a round, the rounds are made longer (budget.py). (Round t's request is
sent as round t-1's last local iteration begins, its time measured over the others (in a
round of one iteration, as the round begins, with the previous round's time), and runs
while that iteration computes and the delta is averaged: the HTTP round trip costs the
round nothing. Round 1's is sent at
its start, with nothing measured: every device gets 1; with a least speed that round
measures, and its weightless push is answered while the next round computes, on the
parameter servers: `_answers_later`; a device that measured before others did computes
that round on until the answers come, every device measured: `round_over`.) It runs K
local steps of the user's optimizer (the built-in loop's: SGD with `-ll`), pushes its delta (its weights minus those it started the
round with) and its BatchNorm statistics; the servers' `esync` rule waits for all N
workers, sets w <- w + gl * mean(delta) (`-gl`) and averages the statistics; the worker
receives the new weights and starts round t+1 from them.

A budget the state server refuses or answers out of range (StateServerRefusal: a job it
does not know, a round it calls past, a budget outside 0..--max-local-steps; e.g. after
a stranger's write to a state server without ESYNC_STATE_TOKEN) costs the worker
nothing but that round's budget: it runs 1 local iteration, as in SSGD, says so in one
line (once, until budgets come again), and asks again next round. An unreachable state
server or a refused token (StateServerError) ends the worker with one line.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import nn

from esync import registry
from esync.algorithms.base import Job, Phases
from esync.algorithms.esync import ESync
from esync.algorithms.esync.budget import INTERIM_AFTER
from esync.algorithms.pushpull import PushPull
from esync.comm.compress import Compression, compression
from esync.comm.link import Link, link_of
from esync.algorithms.rules import RuleConfig
from esync.infra.stateclient import Budget, PendingBudget, StateClient, StateServerRefusal

log = logging.getLogger(__name__)


class ESyncWorker(PushPull):
    """ESync's hooks in a joined job: `policy` (esync.algorithms.esync.ESync) says its
    settings; `state` asks the state server for budgets."""

    def __init__(self, policy: ESync, job: Job, state: StateClient, eval_every: int,
                 link: Optional[Link] = None, backend: str = "ps",
                 compression: Compression = Compression()):
        # the servers' rule carries the policy's outer step and averaging
        rule = RuleConfig(policy.key, job.num_workers, lr=policy.global_lr,
                          momentum=policy.outer_momentum, **registry.AVERAGES[policy.average])
        super().__init__(rule, job, eval_every, synchronous=True, link=link,
                         backend=backend, compression=compression)
        self.lockstep = False  # a round is each device's budget of local iterations
        self.state = state
        self.max_local_steps = policy.max_local_steps
        self.round_time = policy.round_time  # None: the slowest device sets the round
        self.coordination_share = policy.coordination_share
        self.least_speed = policy.sits_out  # slower devices sit rounds out (budget 0)
        #: seconds the last round's synchronisation cost, reported with the next request
        self.coordination: Optional[float] = None
        self._state_wait = 0.0  # this round's wait for its budget
        self.time_per_iteration: Optional[float] = None  # measured in the last round
        #: the last round's time, not yet reported: it ran one iteration, and the next
        #: round's budget was asked for as it began (`_asks_early`)
        self._unreported: Optional[float] = None
        self.budget, self.request_seconds = 1, 0.0
        self.measuring = False  # this round measures speeds: its delta weighs nothing
        self._next: Optional[PendingBudget] = None  # the next round's budget, on its way
        self._steps, self._computing_since = 0, 0.0
        #: round 1's step kept (`_answers_later`): its steps, counted in round 2's delta
        self._carried, self._round = 0, 0
        #: this round is open (round 2 of a device that measured before the others):
        #: it ends once the first round's answers come (`round_over`); its time so far,
        #: reported after budget.INTERIM_AFTER iterations (`iteration_timed`)
        self._open, self._interim = False, None
        self._refused = False  # the last answer was refused: budgets fall back to 1

    @classmethod
    def bind(cls, policy: ESync, opts, job: Optional[Job]) -> "ESyncWorker":
        state = StateClient(opts.state_server_ip, opts.state_server_port, job.id,
                            patience=job.state_server_patience, check=job.node.check)
        if job.rank == 0:
            log.info("[esync] job %s; budgets at %s/jobs/%s/", job.id, state.url, job.id)
        worker = cls(policy, job, state, opts.eval_every, link_of(opts), opts.backend,
                     compression(opts))
        if opts.split_by_class:  # a device that sat out would take its classes with it
            worker.least_speed = 0.0
        return worker

    def discard(self) -> None:
        self.state.close()

    @staticmethod
    def learning_rate(opts) -> float:
        return opts.local_lr  # -ll: ESync's local steps

    def _init_job(self, resume_round: Optional[int] = None) -> None:
        try:
            self.state.init_job(self.rule.num_workers, self.max_local_steps, resume_round,
                                self.round_time, self.coordination_share, self.least_speed)
        except StateServerRefusal as e:
            self._fall_back(e)

    def _fall_back(self, refusal: StateServerRefusal) -> Budget:
        """The budget when the state server's answer is unusable: 1 (SSGD's), said once."""
        if not self._refused:
            log.warning("[esync] %s; worker %d runs 1 local iteration a round until the "
                        "state server answers a budget again", refusal, self.rank)
        self._refused = True
        return Budget(1)

    def _budget(self, pending: PendingBudget) -> Budget:
        try:
            budget = pending.result()
        except StateServerRefusal as e:
            return self._fall_back(e)
        if self._refused:
            log.info("[esync] worker %d has budgets from the state server again", self.rank)
            self._refused = False
        return budget

    def _request(self, round_: int, time_per_iteration: Optional[float]) -> PendingBudget:
        return self.state.budget_later(self.rank, round_, time_per_iteration,
                                       self.max_local_steps, self.coordination)

    def setup(self, model: nn.Module, device: torch.device) -> None:
        if self.rank == 0 and not self.rejoin:  # before the barrier: the job is known
            self._init_job()  # when others ask
        super().setup(model, device)
        if self.resume:  # the state server accepts this job's rounds from here on again
            self._init_job(resume_round=self._continues[0])

    def begin_round(self, round_: int) -> Tuple[int, Phases]:
        start = time.perf_counter()
        pending = self._next or self._request(round_, None)
        (self.budget, self.measuring, opened), self._next = self._budget(pending), None
        # the time this round waited for its budget (usually none: it came meanwhile);
        # not the copy of the round's first weights below: taken as the round began,
        # when 16 workers on 2 cores all start at once, that copy sometimes waited
        # 5-43 ms for a core, and was counted as the state server's although every
        # budget had come before it was needed
        self._state_wait = time.perf_counter() - start
        self.request_seconds, self._round = pending.seconds, round_
        self._open = False
        if round_ == 2 and self._carried:  # the delta is taken from the job's first
            self._round_samples = 0  # weights, the servers' still: round 1 weighed nothing
            if opened:  # on until the first round's answers come: every device measured
                self.budget, self._open = self.max_local_steps, True
        else:
            self._carried = 0
            super().begin_round(round_)  # the weights the round's delta is taken from
        self._steps, self._computing_since = 0, time.perf_counter()
        if self._asks_early():  # one iteration: the last begins now
            self._next, self._unreported = self._request(round_ + 1, self._unreported), None
        return self.budget, {"state server": self._state_wait}

    def local_update(self, model: nn.Module, step: Callable[[], Any]) -> Any:
        """The user's optimizer step, counted (a step AMP skips counts too: the budget is
        of iterations); in a round that measures speeds, counted and timed but not taken,
        so that the weights and the optimizer's state stay as they were (its delta
        weighs nothing: budget.py), except in a new job's first round
        (`_answers_later`)."""
        self._steps += 1
        if self.measuring and not self._answers_later(self._round):
            return None
        return step()

    def iteration_timed(self, computing: float, samples: int) -> None:
        """In an open round, the time per iteration so far is reported once, after
        budget.INTERIM_AFTER iterations: the devices that measure meanwhile are weighed
        against it rather than against this device's first iteration, a warm-up."""
        super().iteration_timed(computing, samples)  # the round's samples
        if self._asks_early():
            self._next = self._request(self._round + 1, (time.perf_counter() -
                                                         self._computing_since) / self._steps)
        if self._open and self._steps == INTERIM_AFTER and self._interim is None:
            self._interim = self.state.budget_later(
                self.rank, self._round, (time.perf_counter() - self._computing_since)
                / self._steps, self.max_local_steps, interim=True)

    def _asks_early(self) -> bool:
        """Whether the next round's budget is asked for now, as the round's last
        iteration begins (its time per iteration measured over the others), rather than
        as the round ends: the state server then has an iteration's time to answer every
        device, off the synchronisation's path. Asked as the push began, 16 workers'
        requests met the state server at once, the last answered after the round's
        bytes had moved (in clear, 38 ms), and the round waited for it. Not in a round
        that measures, or an open one: those ask as they end. A round of one iteration
        asks as it begins, with the time of the round before (`_unreported`): asked as
        it ended, its request had only the moving of the round's bytes to be answered
        in, as in the paper's rule, where every device runs one iteration a round."""
        return self._steps == self.budget - 1 and self._next is None and \
            not (self._open or self.measuring or self._answers_later(self._round))

    def round_over(self) -> bool:
        """An open round (budget.opens) ends once the first round's pushes are answered:
        every device has measured its speed, the last is asking for its budget, and
        those that sit out push at once, so that the round's wait is theirs to ask."""
        return self._open and self.backend.answered()

    aggregate_phase = "global update"

    def end_round(self, round_: int, model: nn.Module) -> Phases:
        # a round sat out (budget 0) measures nothing: it reports no time (null), and
        # the state server keeps the last
        self.time_per_iteration = (time.perf_counter() - self._computing_since) / \
            self._steps if self._steps else None
        if self._interim is not None:  # one request at a time; its answer says nothing new
            try:
                self._interim.result()
            except StateServerRefusal as e:
                log.warning("[esync] worker %d: %s", self.rank, e)
            self._interim = None
        if self._next is None:  # not asked early (_asks_early)
            self._next = self._request(round_ + 1, self.time_per_iteration)
        elif self.budget == 1:  # asked as the round began: its time goes with the next
            self._unreported = self.time_per_iteration
        if self._open:  # logged as the iterations it ran
            self.budget = self._steps
        if self._answers_later(round_):
            self._carried = self._steps  # kept: round 2's delta carries them
            start, steps = time.perf_counter(), self.round_steps()  # 0: weightless
            self.backend.push_later(round_, self.pushed(steps), stop=self._announced,
                                    steps=self.pushed_steps(steps),
                                    samples=self._round_samples)
            return {self.aggregate_phase: time.perf_counter() - start}
        if self.backend.answers_later and self.backend.settle() and \
                self.backend.stop_reason is not None:  # told with the first round's
            return {}  # answers: every worker stops after that round, as if told at once
        phases = super().end_round(round_, model)
        # reported with round t+2's request: round t+1's is on its way already
        self.coordination = max(1e-6, phases[self.aggregate_phase] - self.waited_seconds()
                                + self._state_wait)
        return phases

    def _answers_later(self, round_: int) -> bool:
        """Whether this round's push is answered while the next round computes: a new
        job's first round, which measures speeds on every device (its pushes weigh
        nothing), on the parameter servers. A device that has measured itself then
        trains at once, rather than wait for the slowest device's first iteration (a
        warm-up, at 16x7 2.7 s of the fast device's time). The round keeps its step
        (the answers land in the pushed copies, not in the model), and round 2's
        delta, taken from the job's first weights, carries it: weighted if the device
        trains in round 2, dropped by the pull if it sits out. A device that trains
        while the others sit out thus takes its alone's steps one for one: not taking
        the first moved a seed's time to target by up to 17% either way
        (docs/explanation/simulation.md)."""
        return round_ == 1 and self.measuring and self.rule.by_steps and \
            self.backend.answers_later and self.partial is None and \
            not (self.rejoin or self.resume)

    def round_steps(self) -> int:
        """The round's local iterations; averaged by steps, 0 for a round sat out (or
        left before its first iteration) or one that measured speeds: its delta then
        weighs nothing. Round 2 counts round 1's step where it was kept (`_carried`)."""
        if self.rule.by_steps:
            if self.measuring or not self._steps:
                return 0
            return self._steps + self._carried
        return max(1, self._steps)

    def push_scale(self, steps: int) -> float:
        """The round's delta as it is (with --average normalized divided by its `steps`
        local steps, with --average steps multiplied by them): the servers' rule adds
        the mean delta times -gl."""
        return 1.0 / steps if self.rule.normalize else steps if self.rule.by_steps else 1.0

    def pushed_steps(self, steps: int) -> Optional[int]:
        return steps if self.rule.normalize or self.rule.by_steps else None

    def round_record(self) -> Dict[str, Any]:
        return {**super().round_record(), "budget": self.budget,
                **({"measuring": True} if self.measuring else {}),
                **({"open": True} if self._open else {}),
                "state_server_request": round(self.request_seconds, 6)}

    def finish(self) -> None:
        super().finish()
        self.state.close()
