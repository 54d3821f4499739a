"""ESync's budget rule, apart from HTTP and the database.

Every device should compute for about as long as the slowest device needs for one
local iteration, so nobody idles at the aggregation: the slowest device runs 1 local
iteration a round, and a device k times faster runs about k.

Only living devices count as "the slowest". A worker that died stops asking for budgets,
and its last time would otherwise hold every survivor to its pace for the rest of the
job. A living worker is at most one round behind the job's latest round: it asks for
round t+1 at the end of its round t, as it pushes that round's delta, and nobody asks
for round t+2 before every delta of round t has arrived. So a device whose last round is
GONE_AFTER_ROUNDS (2) or more behind the job's latest counts as gone; one that comes
back asks again, with a later round, and counts again.

A round also costs its synchronisation: the push, the pull, the budget's request, which
on a fast accelerator can take longer than the slowest device's iteration (on one GPU
and 12 CPU workers, 188 ms rounds for 50 ms of computing). With a coordination share s
(`--coordination-share`, ESync's default 0.1), the round is made long enough that the
devices' measured coordination (the most any living device reported, smoothed) takes at
most s of it: its computing lasts at least coordination * (1 - s) / s, but no longer than
the fastest device's --max-local-steps iterations (a longer round would cap the fast
devices' budgets while the slow ones' grow: the fast ones would idle, and the budgets
would no longer follow the speeds). Share 0 is the paper's rule: the slowest device's
one iteration.

A device much slower than the fastest may not help it: its one local iteration a round
is stale by the time the fast device has run its many, and averaging it in (by steps:
its share of the round's iterations) drags the fast device's progress back. With a
least speed l (`--least-speed`, for instance 0.15), a device whose measured speed is
below l times the fastest living device's sits the round out: budget 0, it trains
nothing and its delta weighs nothing (with --average steps), and the round is set by
the devices that train; where only one device trains, nothing is averaged, and its
rounds are as long as --max-local-steps allows, so that the others' synchronisation
costs it little. A device that sits out keeps the speed it last measured, and measures
again every 4 rounds out where its iteration fits in the round and it is not far below
the least speed, else after 4, 8, 16, ... (one whose only time is its first iteration's,
a warm-up, also in its 2nd round out where it fits: `remeasures`): its one iteration,
not taken, its delta weightless; if it is fast enough now, it trains from the next
round: that measurement replaces its average (`smooth`), which was of the device before
it sat out. (On one
H100 and 12 CPU workers, a job without this went at SSGD's pace on the same devices,
its rounds as short as the CPU workers' would be: as if the GPU were not training at
its pace, which a first iteration that measured the GPU's warm-up would cause;
docs/explanation/simulation.md has the run.) If the fast devices die, the fastest of
the living is the new measure and the others train again.

Until a device has measured its speed (its round 1), its budget is 1 and, with a least
speed, its round measures: its delta weighs nothing (`measuring`), since nobody can
tell yet whether it would sit out. In a new job's first round on the parameter servers
the device keeps its step, and round 2's delta carries it if the device trains then
(esync.algorithms.esync.worker), so that a device training while the others sit out
takes its alone's steps one for one; elsewhere (all-reduce, a device coming back) its
step is not taken. A device that has measured itself gets its budget at once, the devices
not measured yet counted as sitting out until they report, and its round is open
(`opens`): on the parameter servers it computes on until every device has measured, at
most the cap, reporting its time so far after INTERIM_AFTER iterations so that those
measuring meanwhile are weighed against its speed, not its warm-up; elsewhere at most
1/least speed of its iterations (5: as long as a device that would train could take
for its first). One that reports later and trains fills what is left (`filling`).
Before, the fast device
waited for the slow devices' first iteration (at 16x7 2.7 s, their warm-up at 23 times
its cost) and then sat a round out, where alone it takes its first step after 0.2 s. A
first round of the cap, tried, made a short job one long round that every device filled
(and ended tests' jobs of a few dozen iterations in round 2). (The first round's pushes,
weightless, are answered meanwhile: esync.algorithms.esync.worker.) Averaged in, a round
of one step on each of 8 devices left the fast device, training alone afterwards, at a
training loss 0.3 above its own alone's for its next 500 steps (charlm, AdamW, 1 fast +
7 at 1/23 of its speed: 3.29, 2.98, 2.85, 2.73, 2.62 over its first five rounds of 64
steps, against 3.21, 2.79, 2.59, 2.44, 2.34 alone and with the slow devices' start-up
weightless), and 50% more samples to val loss 1.80 (3 seeds). Taking the steps and then
rewinding the weights, with the optimizer's state kept, still left it 0.1 behind in each
of 3 seeds (0.79x / 0.81x the fast device alone at 16x7, against 0.62x / 0.71x averaged
in; measuring: 0.98x / 0.86x). Without a least speed (the paper's rule, --least-speed 0)
the start-up rounds weigh as SSGD's.

The default least speed is 0.2, with map-style data drawn by every device from the
whole data set (--data-split whole), so that the device left training does not go round
its own partition. On the emulated matrix (docs/explanation/simulation.md; charlm), one
fast device and 7 or 15 at 1/16 or 1/8 of its speed reached val loss 1.80 and 1.65
slower than the fast device alone with every device training (0.83x and 0.75x at 16x7,
3 seeds), and with l = 0.2 and static partitions the fast device, alone on 1/16 of the
data, stalled at 1.84. Devices at 1/2 of its speed gained (1.28x and 1.24x, one fast and
3 slow, one seed); at 1/4, where the bed's 8 processes crowd 2 cores, they lost (0.84x).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional, Sequence, Tuple

#: a device whose last reported round is this many rounds behind the job's latest round
#: (or more) is taken for dead and left out of the slowest
GONE_AFTER_ROUNDS = 2


#: a device in an open round (`opens`) reports its time so far after this many
#: iterations, its first after its warm-up
INTERIM_AFTER = 2

#: a device that sits rounds out measures again every this many rounds out in a row
#: where its iteration fits in the round, else at this many and every doubling (see
#: remeasures)
REMEASURE_AFTER = 4

#: a device below this share of the least speed (`far_below`) measures again at every
#: doubling of its rounds out, even where its iteration fits
FAR_BELOW = 0.75

#: with a least speed, the fastest device's budget is rounded up (`whole_round`) where
#: that makes the round at most this share longer than its nearest budgets' round
ROUND_UP_WITHIN = 0.25

#: devices whose speeds are within this share of the fastest's count as equally fast
#: where a round is made of whole iterations (`whole_round`): its measured times move by
#: a few percent from round to round
SAME_SPEED = 0.1

#: a planned whole round (`plan`) gives a device the iterations that fit in it, to within
#: this share of one: the fastest device, whose iterations the plan counted whole, may
#: have measured itself a little slower since the round was planned
PLANNED_SLACK = 0.1

#: a device that trains alone while the others sit out synchronises at most this share
#: of its time: its rounds last coordination * (1 - LONE_SHARE) / LONE_SHARE, at least
#: the slowest living device's one iteration (the round as if every device trained: one
#: that measures again holds nobody up), at most the cap's iterations
LONE_SHARE = 0.01


def smooth(previous: Optional[float], measured: float, weight: float,
           fresh: bool = False) -> float:
    """Exponential moving average of a device's time per local iteration (or of its
    coordination), so that one noisy round does not swing the budget. The first
    measurement is taken as it is, and so is a `fresh` one: the first after rounds sat
    out, when the average is of a device that may have changed since (its first
    iteration a warm-up, a GPU loading its kernels, which can take as long as a hundred
    CPU iterations; a load that passed), and a device's second (its first was its
    first iteration alone: averaged in, a warm-up at 1.3-3 times the device's time
    still weighed 17% after 5 rounds, and 16 devices of one speed, their averages
    apart by as much, were given 9 to 12 iterations in one round)."""
    if previous is None or fresh:
        return measured
    return (1.0 - weight) * previous + weight * measured


def remeasures(rounds_out: int, fits: bool, warm_up: bool = False,
               far: bool = False) -> bool:
    """Whether a device that has sat out `rounds_out` rounds in a row (this one
    included) measures its speed again in this round: its one iteration, not taken
    (`measuring`), every REMEASURE_AFTER rounds out where its iteration `fits` in the
    round (it holds nobody up), else at REMEASURE_AFTER and then at every doubling (8,
    16, ...), so that a device found slow by its warm-up, or by a load that passed, is
    not left out for the job, and one rightly found far too slow holds a round up ever
    more rarely. One whose only time is its first iteration's (`warm_up`), weighed
    against a fast device's time after its warm-up (an open round's interim), measures
    again in its 2nd round out where it fits (its 1st is round 2, which the open rounds
    end as it starts). A device at 1/4 of the fast one's speed whose warm-up is 1.25
    times its later iterations, the fast one's 4 times (as at 16x7), looks at 1/5 of
    it: at 4x7 it would sit out 4 of the fast device's rounds alone, 6.4 s each. One
    `far` below the least speed (far_below) measures at every doubling, fitting or not:
    at 8x15 fifteen devices at 1/8 of the fast one's speed measured every 4th round,
    all at once, and the fast device computed those rounds 2-6% slower on the shared
    cores."""
    if warm_up and rounds_out == 2 and fits:
        return True
    if rounds_out < REMEASURE_AFTER:
        return False
    if fits and not far:
        return rounds_out % REMEASURE_AFTER == 0
    return rounds_out & (rounds_out - 1) == 0


def far_below(mine: float, everyone: Sequence[Optional[float]], least_speed: float) -> bool:
    """Whether a device's measured speed (its time per iteration `mine`) is below
    FAR_BELOW of the least speed, as a share of the fastest device's (`everyone`'s
    least time): it would have to become a third faster to train."""
    times = [t for t in everyone if t is not None]
    return bool(least_speed) and bool(times) and \
        min(times) < FAR_BELOW * least_speed * mine


def living(device_round: int, job_round: int) -> bool:
    """Whether a device that last asked for `device_round` counts, in a job whose latest
    round is `job_round`. One that has not asked yet (round 0) is starting, as one at
    round 1: a device may ask for round 2 (as it pushes round 1) before another asked
    for round 1, and nobody asks for round 3 before every delta of round 1 arrived.
    (Counted as gone, a device still starting under load left the fast device a round
    2 of 1 iteration, not open, and it waited for that device's first iteration.)"""
    return max(device_round, 1) > job_round - GONE_AFTER_ROUNDS


def training(everyone: Sequence[Optional[float]], least_speed: float = 0.0) -> list:
    """The times per iteration of the devices that train (every one of `everyone`, or,
    with a `least_speed`, those at least that fraction of the fastest's speed; one not
    measured yet, None, is not among them)."""
    return [everyone[i] for i in trainers(everyone, least_speed)]


def trainers(everyone: Sequence[Optional[float]], least_speed: float = 0.0) -> Tuple[int, ...]:
    """Which of `everyone` train (training's devices), by their place in it."""
    if not least_speed:
        return tuple(range(len(everyone)))
    fastest = min(t for t in everyone if t is not None)
    return tuple(i for i, t in enumerate(everyone)
                 if t is not None and t * least_speed <= fastest)


def unmeasured(mine: Optional[float], everyone: Sequence[Optional[float]]) -> bool:
    """Whether this device (`mine`) or any other (`everyone`) has not measured its time
    per iteration yet (None)."""
    return mine is None or any(t is None for t in everyone)


def opens(mine: Optional[float], everyone: Sequence[Optional[float]], budget_: int,
          least_speed: float = 0.0) -> bool:
    """Whether a device's round is open: with a least speed, one that trains (`budget_`)
    while others have not measured yet. It may then last until they have, at most the
    cap, rather than its budget: on the parameter servers a new job's worker computes
    on until the answers to the first round's pushes come (the last device's first
    iteration is done) and ends its round there (esync.algorithms.esync.worker).
    Its budget (as long as one that would train could take for its first iteration)
    is kept where the worker cannot tell when that is. At 16x7 the fast device's 5
    iterations lasted 0.35 s, the slow devices' first iterations 1.2 s more: it
    waited 0.9 s idle. After INTERIM_AFTER iterations it reports its time so far
    (`interim`), which replaces its first, so that the devices that measure meanwhile
    are weighed against its speed rather than its warm-up: weighed against its first
    iteration (0.2 s, 4 times its next ones) two of seven devices 16 times slower looked
    fast enough, trained a step in round 2 and held it 0.9 s."""
    return bool(least_speed) and bool(budget_) and mine is not None and \
        any(t is None for t in everyone)


def measuring(mine: Optional[float], least_speed: float = 0.0) -> bool:
    """Whether a device's round measures its speed (its delta weighs nothing): with a
    least speed, until it has measured itself."""
    return bool(least_speed) and mine is None


def round_left(given: Sequence[Tuple[float, int, float]]) -> Optional[float]:
    """The seconds left of the longest round others were given (each: the seconds since
    it was given, its budget, its device's time per iteration), or None (none was)."""
    ends = [budget * per_iteration - since for since, budget, per_iteration in given]
    return max(ends) if ends else None


def filling(remaining: float, mine: float, cap: int) -> int:
    """The budget of a device joining a round others began before it had measured its
    speed (its first after measuring; with a least speed): the iterations that fit in
    the `remaining` seconds of the longest round they were given, at least 1, at most
    `cap`, so that it computes until they are done instead of idling at the
    aggregation."""
    return _iterations(remaining / mine, cap)


def _iterations(ratio: float, cap: int) -> int:
    """`ratio` iterations rounded to the nearest whole number, at least 1, at most `cap`
    (an overflow to inf: the cap)."""
    if not ratio < cap:
        return cap
    return max(1, int(ratio + 0.5))


def round_seconds(everyone: Sequence[float], coordination: Optional[float] = None,
                  share: float = 0.0, cap: Optional[int] = None) -> float:
    """The computing a round should last, from every living device's time per
    iteration: the slowest's one iteration, or longer where the coordination measured
    (seconds a round, None: not yet) would take more than `share` of the round, up to
    the fastest device's `cap` iterations."""
    slowest = max(everyone)
    if not share or coordination is None:
        return slowest
    wanted = coordination * (1.0 - share) / share
    if cap is not None:
        wanted = min(wanted, cap * min(everyone))
    return max(slowest, wanted)


def round_computing(everyone: Sequence[float], cap: int, round_time: Optional[float] = None,
                    coordination: Optional[float] = None, share: float = 0.0,
                    least_speed: float = 0.0) -> float:
    """The seconds a round's computing lasts, from every living device's measured time
    per iteration: `round_time`, or, for a device that trains alone while others sit
    out (nothing to average), rounds long enough that its synchronisation costs it at
    most LONE_SHARE of its time and a device that measures again fits in them, or
    round_seconds' of the devices that train, with a least speed in whole iterations
    of the fastest where whole_round says so (every device measured)."""
    return _round(everyone, training(everyone, least_speed), cap, round_time,
                  coordination, share, least_speed)[0]


def _round(everyone: Sequence[Optional[float]], trained: Sequence[float], cap: int,
           round_time: Optional[float], coordination: Optional[float], share: float,
           least_speed: float) -> Tuple[float, bool]:
    """round_computing's seconds (`trained`: training's devices), and whether they are
    whole_round's."""
    if round_time is not None:
        return round_time, False
    measured = None not in everyone
    if len(trained) == 1 and len(everyone) > 1:  # nothing to average: long rounds
        if not measured:  # others measuring: budget() bounds it
            return cap * trained[0], False
        wanted = max(everyone)  # as if every device trained: one measuring fits in it
        if coordination is not None:
            wanted = max(wanted, coordination * (1.0 - LONE_SHARE) / LONE_SHARE)
        return min(wanted, cap * trained[0]), False
    seconds = round_seconds(trained, coordination, share, cap)
    whole = whole_round(trained, seconds, cap) if least_speed and measured else None
    return (seconds, False) if whole is None else (whole, True)


class Plan(NamedTuple):
    """A round's computing `seconds`, whether they are whole_round's (`whole`), and which
    devices train in it (`trainers`' places in the times it was planned from)."""
    seconds: float
    whole: bool
    trainers: Tuple[int, ...]


def plan(everyone: Sequence[Optional[float]], cap: int, round_time: Optional[float] = None,
         coordination: Optional[float] = None, share: float = 0.0,
         least_speed: float = 0.0) -> Optional[Plan]:
    """A round's length, fixed once for every device of the round (`budget`'s
    `planned`); None until every device has measured (the start-up's budgets follow
    each device's own view). Asked device by device, the round's length moved while the
    round's reports came in (the slowest device's time, the most coordination any
    device reported): at 16 equal devices budgets of 1 and 3 in one round, and the
    devices given 1 waited two iterations for the others (a fifth of their time, SSGD's
    wait 6%). A plan holds while the same devices train: one that measured again and
    trains now, or another that sits out, makes another round (the state server plans
    it again)."""
    if None in everyone:
        return None
    seconds, whole = _round(everyone, training(everyone, least_speed), cap, round_time,
                            coordination, share, least_speed)
    return Plan(seconds, whole, trainers(everyone, least_speed))


def budget(mine: Optional[float], everyone: Sequence[Optional[float]], cap: int,
           round_time: Optional[float] = None, coordination: Optional[float] = None,
           share: float = 0.0, least_speed: float = 0.0,
           planned: Optional[Plan] = None) -> int:
    """Local iterations for a device with smoothed time per iteration `mine`, given every
    living device's (its own included; `None`: not measured yet). As many as fit in the
    slowest device's time, or in round_seconds' longer round where the job's
    `coordination` (seconds a round) would take more than `share` of it (at most the
    fastest device's `cap` iterations; with
    `round_time`, in that many seconds instead: every device, the slowest too, runs
    about round_time / its time per iteration), rounded to
    the nearest whole number (the device then waits or is waited for at most half an
    iteration), at least 1, at most `cap`. Until every device has a measurement (round
    1, and round 2 for devices that ask before others reported), the budget is 1: the
    same as SSGD; with a `least_speed`, only until the device itself has measured (a
    round that `measuring` says weighs nothing), and the devices not measured yet count
    as sitting out until they have, its round no longer than 1/least_speed of its
    iterations (as long as a device that would train could take for its first).
    With a `least_speed`, 0 for a device slower than that fraction of the
    fastest's speed (it sits the round out), and the round from those that train (one
    that trains alone: round_computing's), in whole iterations of the
    fastest where that costs the others little (`whole_round`: it does not wait).
    With `planned` (`plan`'s), the round's length is the one every device of the round
    is given, whoever asked first."""
    if mine is None or (not least_speed and unmeasured(mine, everyone)):
        return 1
    trained = training(everyone, least_speed)
    if mine > max(trained):
        return 0
    seconds, whole = planned[:2] if planned else _round(
        everyone, trained, cap, round_time, coordination, share, least_speed)
    if least_speed and unmeasured(mine, everyone):
        # others still on their first iteration: no longer than one that would train
        # (at least least_speed of this device's speed) can take for it
        return _iterations(min(seconds / mine, 1.0 / least_speed), cap)
    if whole:  # as many as fit: the fastest's rounded up, none waits long (a planned
        # round's fastest device may have measured itself a little slower since)
        return max(1, min(cap, int(seconds / mine + (PLANNED_SLACK if planned else 1e-9))))
    return _iterations(seconds / mine, cap)  # may overflow to inf: then the cap


def whole_round(trained: Sequence[float], seconds: float, cap: int) -> Optional[float]:
    """The round's computing in whole iterations of the fastest devices, or None: with
    the budgets nearest `seconds` (each device's within half an iteration of it), the
    round lasts as long as the longest of the `trained` devices' budgets, and the
    fastest device, its budget rounded down, would wait for the others; rounded up, it
    computes on while they finish theirs, and every other device runs as many
    iterations as fit in its round (at least as many as its nearest budget). Only where
    that makes the round at most ROUND_UP_WITHIN longer (and the fastest's budget
    within the `cap`): where a device at half the fast one's speed would wait a third
    of its round, it is left as it was. In the LM's 4x7 cell
    (docs/explanation/simulation.md), budget 4 of the fast device at 4.3 times a slow
    one's speed, its wait at the aggregation was 38 ms a round of 342 ms computing
    (the slowest of 7 devices sets the round): 10% of its time. Devices within
    SAME_SPEED of the fastest's speed count as the fastest, the round in whole
    iterations of the slowest of them: rounded up to the very fastest's, 16 devices
    of one speed, measured 5% apart, were given 4 and 5 iterations, and those given 4
    waited most of an iteration a round."""
    if len(trained) < 2:
        return None
    fastest = min(trained)
    pace = max(t for t in trained if t <= (1.0 + SAME_SPEED) * fastest)
    longest = max(_iterations(seconds / t, cap) * t for t in trained)
    iterations = math.ceil(longest / pace - 1e-9)
    if int(iterations * pace / fastest + 1e-9) > cap or \
            iterations * pace > (1.0 + ROUND_UP_WITHIN) * longest:
        return None
    return iterations * pace
