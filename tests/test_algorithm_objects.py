"""Algorithms as objects (esync.ESync(...), esync.SSGD(), ...): a script's object takes
the place of its flags' values in a real job started by esync-run; another algorithm's
object than the job's -m ends the script with one line; the objects' defaults are the
flags'; ESync's budget rule is one torch-free module that the state server and
esync-stalls both use."""
import json
import os
import subprocess
import sys

import pytest

import esync
from esync import config, registry
from esync.stalls import stallmodel
from esync.algorithms.esync import budget
from esync.errors import UserError
from esync.algorithms.policy import check_aggregation
from esync.options import parse_options
from tests.helpers import REPO

SCRIPT = os.path.join(REPO, "tests", "algorithm_script.py")


def esync_run(tmp_path, flags, algorithm, *script_args):
    return subprocess.run(
        [sys.executable, "-m", "esync.launch.run", "--out", str(tmp_path / "runs"),
         "--no-progress", "--num-threads", "1", *flags, SCRIPT, algorithm, *script_args],
        cwd=tmp_path, capture_output=True, text=True, timeout=240)


def budgets(tmp_path, device):
    folder = tmp_path / "runs" / "algorithm_script" / "esync"
    (host,) = [h for h in folder.iterdir() if h.is_dir()]
    path = host / device
    count = len([f for f in os.listdir(path) if f.startswith("iter-")])
    return [json.load(open(path / f"iter-{n}.json"))["budget"] for n in range(1, count + 1)]


@pytest.mark.slow
def test_an_esync_object_s_max_local_steps_caps_the_budgets_the_flags_would_not(tmp_path):
    """The job's flags leave --max-local-steps at 64; the script's ESync(max_local_steps=2)
    caps the fast device's budgets at 2 (a device 4 times faster would get about 4)."""
    proc = esync_run(tmp_path, ["--workers", "2", "-m", "esync", "--slowdown", "1,4"],
                     "esync.ESync(max_local_steps=2)")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fast = budgets(tmp_path, "w0")
    assert max(fast) == 2 and fast.count(2) >= 3, fast


@pytest.mark.slow
def test_an_object_of_another_algorithm_than_the_job_s_ends_it_with_one_line(tmp_path):
    proc = esync_run(tmp_path, ["--workers", "2", "-m", "sync"], "esync.ESync(max_local_steps=4)")
    assert proc.returncode != 0
    lines = [line for line in (proc.stdout + proc.stderr).splitlines()
             if "does not run in this job" in line]
    assert lines and "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "-m sync (SSGD); start it with -m esync" in lines[0]


@pytest.mark.slow
def test_settings_given_after_prepare_model_which_sent_the_flags_end_it_with_one_line(tmp_path):
    """prepare_model gave the servers and the state server the flags' settings: an
    object that differs, given afterwards, is refused rather than half applied."""
    proc = esync_run(tmp_path, ["--workers", "2", "-m", "esync"],
                     "esync.ESync(max_local_steps=2)", "late")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    assert any("came after prepare_model" in line and "wrap the optimizer first" in line
               for line in out.splitlines()), out


@pytest.mark.parametrize("key", list(registry.ALGORITHMS))
def test_an_object_s_defaults_are_its_flags_defaults(key):
    policy = registry.ALGORITHMS[key].policy_class()
    assert policy() == policy.from_options(parse_options([]))
    assert getattr(esync, type(policy()).__name__) is policy


def test_bad_settings_of_an_object_are_one_line_errors():
    with pytest.raises(ValueError, match=r"ESync\(max_local_steps=0\): expected a positive"):
        esync.ESync(max_local_steps=0)
    with pytest.raises(ValueError, match=r"ESync\(average='median'\)"):
        esync.ESync(average="median")
    with pytest.raises(ValueError, match=r"ESync\(outer_momentum=1.0\)"):
        esync.ESync(outer_momentum=1.0)


def test_a_round_lasts_long_enough_that_its_coordination_keeps_its_share():
    # the slowest device's iteration, where the coordination's share is kept
    assert budget.round_seconds([0.01, 0.04], 0.004, 0.1) == 0.04
    # else long enough: 30 ms of coordination is a tenth of 300 ms in all
    assert budget.round_seconds([0.01, 0.04], 0.03, 0.1) == pytest.approx(0.27)
    # share 0 (the paper's rule) or nothing measured yet: the slowest device's iteration
    assert budget.round_seconds([0.01, 0.04], 0.03, 0.0) == 0.04
    assert budget.round_seconds([0.01, 0.04], None, 0.1) == 0.04
    assert budget.budget(0.01, [0.01, 0.04], 64, coordination=0.03, share=0.1) == 27
    assert budget.budget(0.04, [0.01, 0.04], 64, coordination=0.03, share=0.1) == 7
    # but no longer than the fastest device's cap of iterations: the budgets keep the
    # devices' speeds (16 and 4), where a 270 ms round would give 16 and 7
    assert budget.round_seconds([0.01, 0.04], 0.03, 0.1, cap=16) == pytest.approx(0.16)
    assert budget.budget(0.01, [0.01, 0.04], 16, coordination=0.03, share=0.1) == 16
    assert budget.budget(0.04, [0.01, 0.04], 16, coordination=0.03, share=0.1) == 4
    # never shorter than the slowest device's iteration
    assert budget.round_seconds([0.01, 0.5], 0.03, 0.1, cap=16) == 0.5
    # an explicit round time wins
    assert budget.budget(0.01, [0.01, 0.04], 64, 0.1, coordination=0.03, share=0.1) == 10


def test_with_a_least_speed_the_fastest_device_computes_on_rather_than_wait():
    """The nearest budgets leave the fastest device waiting for the slowest (4 of its
    iterations, 40 ms, against 43 ms); with a least speed its budget is rounded up
    where the round grows by at most a quarter, and the others run as many iterations
    as fit in that round; where it would grow more (a device at 1/2.2 of the fast
    one's speed would wait a third of its round), the budgets stay the nearest."""
    times = [0.010, 0.043, 0.043]
    assert [budget.budget(t, times, 64) for t in times] == [4, 1, 1]  # the paper's rule
    assert [budget.budget(t, times, 64, least_speed=0.2) for t in times] == [5, 1, 1]
    assert budget.whole_round(times, 0.043, 64) == pytest.approx(0.05)
    # the round is that long for the state server's other questions too (does a device
    # that sits out fit in it?), not only for the budgets
    assert budget.round_computing(times, 64, least_speed=0.2) == pytest.approx(0.05)
    assert budget.round_computing(times, 64) == 0.043
    # a device in between fills the longer round: 50 ms is 2 of its 24 ms iterations
    assert [budget.budget(t, [0.010, 0.024, 0.043], 64, least_speed=0.2)
            for t in (0.010, 0.024, 0.043)] == [5, 2, 1]
    slower = [0.010, 0.022]  # rounded up: 30 ms for 22, a round 36% longer
    assert budget.whole_round(slower, 0.022, 64) is None
    assert [budget.budget(t, slower, 64, least_speed=0.2) for t in slower] == [2, 1]
    # never past the cap, and nothing to round where one device trains or the user
    # set the round's time
    assert budget.whole_round(times, 0.043, 4) is None
    assert budget.budget(0.010, times, 4, least_speed=0.2) == 4
    assert budget.whole_round([0.010], 0.64, 64) is None
    assert budget.budget(0.010, times, 64, round_time=0.043, least_speed=0.2) == 4


def test_devices_of_one_speed_measured_a_little_apart_get_one_budget():
    """Devices within SAME_SPEED of the fastest's speed count as equally fast: the round
    is whole iterations of the slowest of them, and each runs as many as fit, the same
    number; rounded up to the very fastest's, some were given one iteration fewer and
    waited most of it."""
    times = [0.140 + 0.0005 * i for i in range(16)]  # one speed, 5% apart
    for seconds in (0.3, 0.45, 0.66, 0.9):
        planned = budget.plan(times, 64, coordination=seconds / 9, share=0.1,
                              least_speed=0.2)
        got = {budget.budget(t, times, 64, coordination=seconds / 9, share=0.1,
                             least_speed=0.2, planned=planned) for t in times}
        assert len(got) == 1, (seconds, got)
        assert planned.whole and abs(planned.seconds - seconds) <= 0.25 * seconds
    # a device 4.3 times slower is not of the fastest's speed: the fast one's budget is
    # still rounded up to its own iterations
    assert budget.whole_round([0.010, 0.043], 0.043, 64) == pytest.approx(0.05)


def test_a_device_training_alone_synchronises_a_hundredth_of_its_time():
    """Where the others sit out, the device that trains alone runs rounds long enough
    that its synchronisation (20 ms) costs it 1% of its time (1.98 s; 36 of the LM's 55
    ms iterations) and at least as long as the slowest device's iteration (as if every
    device trained: one that measures again holds it up for nothing; 4 of the ResNet's
    0.45 s against 1.8 s, 6 against 2.5 s, where the cap's 64 made 29 s rounds, the
    model served that late), the latter alone while the coordination is not measured;
    never more than the cap."""
    everyone = [0.45, 1.8, 1.8]  # least speed 0.3: the slow devices at 0.25 sit out
    assert [budget.budget(t, everyone, 64, coordination=0.02, least_speed=0.3)
            for t in everyone] == [4, 0, 0]
    assert budget.round_computing(everyone, 64, coordination=0.02, least_speed=0.3) == \
        pytest.approx(1.98)
    slower = [0.45, 2.5, 2.5]
    assert budget.round_computing(slower, 64, coordination=0.02, least_speed=0.3) == 2.5
    assert budget.budget(0.45, slower, 64, coordination=0.02, least_speed=0.3) == 6
    assert budget.budget(0.45, slower, 64, least_speed=0.3) == 6
    assert budget.budget(0.055, [0.055, 1.0], 64, coordination=0.02, least_speed=0.2) == 36
    assert budget.budget(0.01, [0.01, 1.0], 64, coordination=0.02, least_speed=0.2) == 64


def test_a_device_far_slower_than_the_fastest_sits_rounds_out():
    """With a least speed of 0.15, a device 8 times slower than the fastest gets budget 0
    and the round is the devices' that train; one 4 times slower trains; 0 is the
    paper's rule, where every device trains."""
    times = [0.01, 0.04, 0.08, 0.08]
    assert budget.training(times, 0.15) == [0.01, 0.04]
    assert [budget.budget(t, times, 64, least_speed=0.15) for t in times] == [4, 1, 0, 0]
    assert [budget.budget(t, times, 64) for t in times] == [8, 2, 1, 1]
    # the coordination's share is kept over the devices that train (the slow device's
    # 7 iterations last 280 ms: the fastest runs 28, not 27, and waits for nobody)
    assert [budget.budget(t, times, 64, coordination=0.03, share=0.1, least_speed=0.15)
            for t in times] == [28, 7, 0, 0]
    # the fastest alone trains: it runs as many as its round, here its cap, holds
    assert [budget.budget(t, [0.01, 0.2], 16, coordination=0.03, share=0.1,
                          least_speed=0.15) for t in (0.01, 0.2)] == [16, 0]
    # at exactly the least speed a device trains; least speed 1: only the fastest
    assert budget.budget(8.0, [1.0, 8.0], 64, least_speed=0.125) == 1
    assert budget.budget(0.02, [0.01, 0.02], 64, least_speed=1.0) == 0
    # a device not measured yet runs 1 and measures; without a least speed every budget
    # is 1 until every device has measured (as before)
    assert budget.budget(None, [None, None], 64, least_speed=0.15) == 1
    assert budget.budget(None, [0.01, None], 64, least_speed=0.15) == 1
    assert budget.measuring(None, 0.15) and not budget.measuring(0.01, 0.15)
    assert not budget.measuring(None, 0.0)
    assert budget.budget(0.08, [0.01, None], 64) == 1
    # with one, a device that has measured itself trains at once, the others counted as
    # sitting out until they report, for at most 1/least speed of its iterations (as
    # long as one that would train could take for its first): alone, not its cap...
    assert budget.budget(0.01, [0.01, None, None], 64, least_speed=0.15) == 7
    assert budget.budget(0.01, [0.01, None, None], 64, least_speed=0.5) == 2
    assert budget.budget(0.01, [0.01, None], 4, coordination=0.03, share=0.1,
                         least_speed=0.15) == 4
    # ...those measured share the round as the rule says, and a slow one sits out
    assert [budget.budget(t, [0.01, 0.04, None], 64, least_speed=0.15)
            for t in (0.01, 0.04)] == [4, 1]
    assert budget.budget(0.08, [0.01, None], 64, least_speed=0.15) == 0
    assert budget.round_computing([0.01, None, 0.2], 16, least_speed=0.15) == 16 * 0.01
    # one measured later fills what is left of the round the first was given
    assert budget.round_left([(0.5, 16, 0.1), (0.1, 2, 0.5)]) == pytest.approx(1.1)
    assert budget.round_left([]) is None
    assert budget.filling(1.6, 0.1, 64) == 16
    assert budget.filling(0.01, 0.1, 64) == 1 and budget.filling(100.0, 0.1, 64) == 64


def test_an_esync_object_s_least_speed_applies_only_where_deltas_weigh_as_steps():
    assert esync.ESync().least_speed == config.LEAST_SPEED == esync.ESync().sits_out
    assert esync.ESync(average="mean").sits_out == 0.0
    assert esync.ESync(least_speed=0.0).sits_out == 0.0
    with pytest.raises(ValueError, match=r"ESync\(least_speed=1.5\)"):
        esync.ESync(least_speed=1.5)


def test_the_budget_rule_is_one_torch_free_module_that_its_users_share():
    code = ("import sys; import esync.algorithms.esync.budget; "
            "print('torch' in sys.modules, 'django' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, env={**os.environ, "PYTHONPATH": os.path.join(REPO, "src")})
    assert result.stdout.split() == ["False", "False"]
    assert stallmodel.budget_rule is budget
    for name in ("views.py", "live.py"):
        source = open(os.path.join(REPO, "stateserver", "budgets", name)).read()
        assert "from esync.algorithms.esync import budget as budget_rule" in source, name
    assert not os.path.exists(os.path.join(REPO, "stateserver", "budgets", "rule.py"))
    # esync-stalls predicts what the state server answers, round_time aside
    assert stallmodel.budget(0.010, [0.010, 0.040], 16) == budget.budget(0.010, [0.010, 0.040], 16)


def test_an_object_s_own_checks_are_its_flags_checks():
    """What check_aggregation refuses of the flags, the object's `check` refuses of its
    settings in that job (DistributedOptimizer runs it before the object takes over)."""
    with pytest.raises(UserError, match="--min-batch 64 is more than -b 32"):
        esync.BalancedDDP(min_batch=64).check(parse_options(["-m", "ddp", "-b", "32"]))
    with pytest.raises(UserError, match="which --outer-momentum would move"):
        esync.ESync(outer_momentum=0.9).check(parse_options(["-m", "esync", "--compress",
                                                             "partial:4"]))
    with pytest.raises(UserError, match="--min-batch 64 is more than -b 32"):
        check_aggregation(parse_options(["-m", "ddp", "--balance-batches", "1",
                                                  "-b", "32", "--min-batch", "64"]))
    esync.BalancedDDP(min_batch=32).check(parse_options(["-m", "ddp", "-b", "32"]))
    # --global-batch: the object's setting goes in the flag's place; a bad one is refused
    opts = esync.BalancedDDP(global_batch="fastest").applied(
        parse_options(["-m", "ddp", "--balance-batches", "1"]))
    assert opts.global_batch == "fastest"
    check_aggregation(opts)
    with pytest.raises(ValueError, match="global_batch='all'"):
        esync.BalancedDDP(global_batch="all")
