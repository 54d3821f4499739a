"""--slowdown's wait (esync.infra.clock.Slowdown), in process: each local iteration's
computing is made to last F times the lower quartile of the recent iterations' (CPU time
where given, else wall time), less what earlier iterations overran."""
import pytest

from esync.infra.clock import Slowdown, lower_quartile


def test_the_wait_tops_the_iteration_up_to_f_times_the_recent_lower_quartile():
    slower = Slowdown(3)
    # wall 2 ms of which the CPU computed 1 ms: the device's own cost is 1 ms
    assert slower.wait(0.002, 64, cpu_seconds=0.001) == pytest.approx(0.001)
    # the lower quartile of 1 ms and 2, 3, 3, 3 ms of CPU (the others' load in them) is
    # 2 ms: the iteration lasts 6 ms in all (the median, 3 ms, would make it 9)
    for cpu in (0.003, 0.003, 0.003):
        slower.wait(0.001, 64, cpu_seconds=cpu)  # (within their share: nothing owed)
    assert slower.wait(0.0025, 64, cpu_seconds=0.002) == pytest.approx(0.006 - 0.0025)
    # an iteration that alone took longer than its share waits nothing, and is not cut
    assert slower.wait(0.050, 64, cpu_seconds=0.002) == 0.0


def test_what_an_iteration_overran_comes_off_the_next_waits():
    """An iteration that waited for a core (wall far above its CPU time) is not cut, and
    its excess over its share comes off the next waits: the device keeps its speed."""
    slower = Slowdown(3)
    for _ in range(4):
        assert slower.wait(0.001, 8, cpu_seconds=0.001) == pytest.approx(0.002)
    # 5 ms where its share is 3: 2 ms owed, taken off the next wait
    assert slower.wait(0.005, 8, cpu_seconds=0.001) == 0.0
    assert slower.wait(0.001, 8, cpu_seconds=0.001) == pytest.approx(0.0)
    assert slower.owed == pytest.approx(0.0)
    assert slower.wait(0.001, 8, cpu_seconds=0.001) == pytest.approx(0.002)
    # what is owed is at most one iteration's share (3 ms): a long stall is not made up
    assert slower.wait(0.100, 8, cpu_seconds=0.001) == 0.0
    assert slower.owed == pytest.approx(0.003)
    assert slower.wait(0.001, 8, cpu_seconds=0.001) == 0.0
    assert slower.wait(0.001, 8, cpu_seconds=0.001) == pytest.approx(0.001)


def test_wall_time_is_the_measure_without_cpu_seconds():
    slower = Slowdown(2)
    assert slower.wait(0.001, 8) == pytest.approx(0.001)
    assert slower.wait(0.0015, 8) == pytest.approx(2 * 0.001 - 0.0015)


def test_a_new_batch_size_starts_the_window_afresh():
    slower = Slowdown(2)
    for _ in range(5):
        slower.wait(0.001, 64, cpu_seconds=0.001)
    # a batch 4 times as large: its time counts at once, not after the window turns
    assert slower.wait(0.004, 256, cpu_seconds=0.004) == pytest.approx(0.004)
    assert list(slower.recent) == [0.004]


def test_the_window_forgets_old_iterations():
    slower = Slowdown(2)
    for _ in range(Slowdown.WINDOW):
        slower.wait(0.0, 1, cpu_seconds=0.010)
    for _ in range(Slowdown.WINDOW // 2 + 1):
        waited = slower.wait(0.0, 1, cpu_seconds=0.001)
    assert waited == pytest.approx(0.002)  # most of the window is of 1 ms now


def test_factor_one_never_waits():
    assert Slowdown(1.0).wait(0.5, 64, cpu_seconds=0.1) is None


def test_part_of_the_wait_comes_before_the_computing_and_the_whole_is_unchanged():
    """A share of the expected wait, (F - 1) m less what is owed, drawn uniformly, is
    waited before the computing (`before`), so that the computing falls anywhere in
    the iteration; the wait after it is the rest, the iteration as long as before."""
    spread, plain = Slowdown(3, seed=1), Slowdown(3)
    shares = []
    for cpu in (0.001, 0.002, 0.001, 0.001, 0.0015, 0.001, 0.001, 0.001):
        ahead = spread.ahead_of_computing()
        if len(spread.recent) > 1:
            expected = 2 * lower_quartile(spread.recent)  # (F - 1) m, nothing owed
            assert 0.0 <= ahead <= expected
            shares.append(ahead / expected)
        else:
            assert ahead == 0.0  # nothing measured yet, or only the warm-up
        # the whole wait is the plain rule's, however it is split
        assert spread.due(0.001, 8, cpu_seconds=cpu) == pytest.approx(
            plain.due(0.001, 8, cpu_seconds=cpu))
        assert spread.ahead == 0.0  # taken into the iteration's whole wait
    assert len(set(shares)) == len(shares) and max(shares) - min(shares) > 0.3


def test_a_wait_before_that_outlasts_the_whole_wait_is_an_overrun():
    """The computing ran long after a wait before it: the iteration waits nothing more,
    and its excess over its share, the early wait included, comes off the next waits."""
    slower = Slowdown(3, seed=2)
    for _ in range(4):
        slower.wait(0.001, 8, cpu_seconds=0.001)
    ahead = slower.ahead_of_computing()
    assert 0.0 < ahead <= 0.002
    # computing of 3 ms - ahead / 2: the iteration, its early wait in, lasts 3 + ahead / 2
    assert slower.due(0.003 - ahead / 2, 8, cpu_seconds=0.001) == pytest.approx(ahead)
    assert slower.owed == pytest.approx(ahead / 2)


def test_the_waits_before_the_computing_follow_the_seed():
    """The draws follow the seed (the worker's rank), so a run's waits replay."""
    runs = []
    for _ in range(2):
        slower, run = Slowdown(2, seed=7), []
        for _ in range(5):
            run.append(slower.ahead_of_computing())
            slower.due(0.001, 8, cpu_seconds=0.001)
        runs.append(run)
    assert runs[0] == runs[1] and runs[0][:2] == [0.0, 0.0] and all(a > 0 for a in runs[0][2:])


def test_the_warm_up_alone_does_not_set_the_wait_before_the_computing():
    """After the first iteration only (a warm-up, 3 times the next ones' CPU time),
    nothing is waited before the second's computing: as much as 20 times the warm-up
    would have been, for an iteration that is to last 21 times a third of it."""
    slower = Slowdown(21, seed=3)
    slower.due(0.9, 8, cpu_seconds=0.3)
    assert slower.ahead_of_computing() == 0.0
    slower.due(0.1, 8, cpu_seconds=0.1)
    assert 0.0 < slower.ahead_of_computing() <= 20 * 0.1


def test_a_device_that_sat_rounds_out_owes_nothing():
    """What an iteration overran before the device sat rounds out does not shorten its
    next iteration, which measures its speed again."""
    slower = Slowdown(3)
    for _ in range(4):
        slower.due(0.001, 8, cpu_seconds=0.001)
    slower.due(0.005, 8, cpu_seconds=0.001)
    assert slower.owed == pytest.approx(0.002)
    slower.rested()
    assert slower.due(0.001, 8, cpu_seconds=0.001) == pytest.approx(0.002)
