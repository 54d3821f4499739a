"""esync/logs_tools/speedup.py: the speed-up over the fastest device alone and the
fraction of the ideal, on hand-made summaries with hand-computed answers."""
import pytest

from esync.logs_tools import speedup


def device(samples, compute, elapsed, accuracy=None):
    """One device's summary record: rounds of `samples` each, `compute` seconds of
    computing each, ending at the `elapsed` times, evaluations `accuracy`."""
    rounds = len(elapsed)
    return {"num_samples_list": [samples] * rounds, "compute_time_list": [compute] * rounds,
            "elapsed_time_list": list(elapsed),
            "accuracy_list": list(accuracy) if accuracy else [None] * rounds}


def job(curve, *devices):
    """A job's summary: an evaluator with the curve [(seconds, accuracy)] and the
    training devices [(samples, compute, elapsed)]."""
    times, values = zip(*curve)
    evaluator = {"num_samples_list": [0] * len(times), "compute_time_list": [0.0] * len(times),
                 "elapsed_time_list": list(times), "accuracy_list": list(values)}
    return {"host": {"evaluator": evaluator,
                     **{f"w{k}": device(*d) for k, d in enumerate(devices)}}}


def test_a_devices_rate_is_its_samples_per_second_of_computing_and_the_ideal_sum_over_max():
    # w0: 4 rounds of 100 samples, 0.1 s each: 1000/s; w1: 2 rounds of 100, 0.4 s: 250/s
    summary = job([(1.0, 0.5)], (100, 0.1, [1, 2, 3, 4]), (100, 0.4, [2, 4]))
    assert speedup.device_rates(summary) == pytest.approx({"w0": 1000.0, "w1": 250.0})
    assert speedup.ideal(speedup.device_rates(summary).values()) == pytest.approx(1.25)
    assert speedup.ideal([500.0, 250.0, 250.0, None, 0.0]) == pytest.approx(2.0)
    assert speedup.ideal([]) is None


def test_a_device_that_never_computed_has_no_rate_and_counts_nowhere():
    summary = job([(1.0, 0.5)], (100, 0.1, [1]), (0, 0.0, [1]))
    assert speedup.device_rates(summary) == pytest.approx({"w0": 1000.0})
    assert speedup.ideal(speedup.device_rates(summary).values()) == pytest.approx(1.0)


def test_the_best_learning_rate_has_the_lowest_median_and_ties_go_to_the_smaller():
    stats = {1.0: {"median": 8.0}, 2.0: {"median": 6.0}, 4.0: {"median": None}}
    assert speedup.best_learning_rate(stats) == (2.0, {"median": 6.0})
    assert speedup.best_learning_rate({4.0: {"median": 6.0}, 2.0: {"median": 6.0}})[0] == 2.0
    assert speedup.best_learning_rate({1.0: {"median": None}}) is None


def test_speed_ups_and_fractions_are_ratios_of_medians_and_not_reached_stays_none():
    assert speedup.speedup(10.0, 4.0) == pytest.approx(2.5)
    assert speedup.fraction(2.5, 2.0) == pytest.approx(1.25)
    assert speedup.speedup(None, 4.0) is None and speedup.speedup(10.0, None) is None
    assert speedup.fraction(None, 2.0) is None and speedup.fraction(1.0, 0.0) is None


def alone_runs():
    """The fast device alone (1000 samples/s of computing, 100 samples per 0.1 s
    round) at x1 (seeds reach 0.9 at 6, 8, 10 s) and x2 (at 4 s, never, 5 s)."""
    def run(t):
        return job([(t, 0.9)] if t else [(1.0, 0.5)], (100, 0.1, [1, 2, 3, 4, 5]))
    return {1.0: {"seed0": run(6.0), "seed1": run(8.0), "seed2": run(10.0)},
            2.0: {"seed0": run(4.0), "seed1": run(None), "seed2": run(5.0)}}


def test_the_fast_device_alone_takes_per_target_its_best_learning_rate():
    alone = speedup.alone(alone_runs(), [0.5, 0.9])
    # x2's seeds: 4, 5, not reached -> median 5 (a seed not reached is slower than all)
    assert alone["targets"]["0.90"]["lr"] == 2.0
    assert alone["targets"]["0.90"]["time"]["median"] == 5.0
    assert alone["targets"]["0.90"]["by_lr"]["1"]["median"] == 8.0
    # 0.5: x1 at 6, 8, 10 s (with 0.9); x2 at 4, 1 (seed1 never passed 0.5), 5 s
    assert alone["targets"]["0.50"]["lr"] == 2.0
    assert alone["targets"]["0.50"]["time"]["median"] == 4.0
    # 500 samples over 5 s in every run: 100 samples/s; 1000 per second of computing
    assert alone["samples_per_s"] == pytest.approx(100.0)
    assert alone["computing_samples_per_s"] == pytest.approx(1000.0)


def test_a_method_is_measured_against_the_alone_baseline_and_its_own_ideal():
    alone = speedup.alone(alone_runs(), [0.9, 0.95])
    # two devices of 1000/s and 250/s (ideal 1.25); 5 + 2 rounds of 100 in 5 s: 140/s
    method = {f"seed{k}": job([(t, 0.9)], (100, 0.1, [1, 2, 3, 4, 5]), (100, 0.4, [2, 5]))
              for k, t in enumerate([4.0, 2.0, 3.0])}
    result = speedup.job(method, alone, [0.9, 0.95])
    assert result["ideal"]["median"] == pytest.approx(1.25)
    assert result["samples_per_s"]["median"] == pytest.approx(140.0)
    # (140 / 100) / 1.25
    assert result["throughput_fraction"] == pytest.approx(1.12)
    # the devices compute 1000 + 250 per second, the fast one alone 1000
    assert result["computing_over_alone"]["median"] == pytest.approx(1.25)
    at = result["targets"]["0.90"]
    assert at["time"]["median"] == 3.0
    assert at["speedup"] == pytest.approx(5.0 / 3.0)
    assert at["fraction"] == pytest.approx(5.0 / 3.0 / 1.25)
    # nobody reached 0.95: no time, no speed-up, no fraction (not the time limit)
    assert result["targets"]["0.95"]["time"]["median"] is None
    assert result["targets"]["0.95"]["speedup"] is None
    assert result["targets"]["0.95"]["fraction"] is None
    assert alone["targets"]["0.95"] == {"lr": None, "time": None,
                                        "by_lr": alone["targets"]["0.95"]["by_lr"],
                                        "by_seed": None, "crossing_by_seed": None}
    assert result["targets"]["0.95"]["paired"]["median"] is None


def test_a_method_reached_by_fewer_than_half_of_its_seeds_has_no_speed_up():
    alone = speedup.alone(alone_runs(), [0.9])
    method = {"seed0": job([(3.0, 0.9)], (100, 0.1, [1])),
              "seed1": job([(3.0, 0.5)], (100, 0.1, [1])),
              "seed2": job([(3.0, 0.5)], (100, 0.1, [1]))}
    at = speedup.job(method, alone, [0.9])["targets"]["0.90"]
    assert at["time"]["reached"] == 1 and at["time"]["median"] is None
    assert at["speedup"] is None


def test_a_crossing_is_interpolated_between_the_evaluation_short_of_the_target_and_the_one_at_it():
    summary = job([(2.0, 0.5), (4.0, 0.7), (6.0, 0.95)], (100, 0.1, [1]))
    # 0.9 lies 0.2 / 0.25 of the way from 0.7 (4 s) to 0.95 (6 s)
    assert speedup.crossing(summary, 0.9) == pytest.approx(5.6)
    assert speedup.crossing(summary, 0.4) == 2.0          # reached at the first evaluation
    assert speedup.crossing(summary, 0.99) is None
    loss = {"host": {"evaluator": {"num_samples_list": [0, 0], "compute_time_list": [0.0, 0.0],
                                   "elapsed_time_list": [5.0, 10.0],
                                   "val_loss_list": [2.0, 1.0]}}}
    # a loss falls: 1.8 lies 0.2 of the way from 2.0 to 1.0
    assert speedup.crossing(loss, 1.8) == pytest.approx(6.0)
    assert speedup.crossings({"seed0": summary, "seed1": loss}, 0.9, "accuracy") == \
        {"seed0": pytest.approx(5.6), "seed1": None}


def test_the_paired_speed_up_compares_each_seed_with_the_alone_s_same_seed():
    alone_times = {"seed0": 6.0, "seed1": 8.0, "seed2": None}
    # seed0 twice as fast, seed1 not reached (0), seed2's alone not reached (left out)
    spread = speedup.paired(alone_times, {"seed0": 3.0, "seed1": None, "seed2": 1.0,
                                          "seed3": 2.0})
    assert spread["per_seed"] == [2.0, 0.0, None, None]
    assert spread["median"] == pytest.approx(1.0)
    assert speedup.paired({}, {"seed0": 1.0})["median"] is None
    assert speedup.paired({"seed0": 1.0}, {"seed0": 0.0})["per_seed"] == [None]


def test_a_method_s_paired_speed_ups_use_the_alone_s_seeds_at_its_best_learning_rate():
    alone = speedup.alone(alone_runs(), [0.9])
    # the best is x2: seeds at 4, never, 5 s (one evaluation each: no interpolation)
    assert alone["targets"]["0.90"]["by_seed"] == {"seed0": 4.0, "seed1": None, "seed2": 5.0}
    assert alone["targets"]["0.90"]["crossing_by_seed"] == alone["targets"]["0.90"]["by_seed"]
    method = {f"seed{k}": job([(t / 2, 0.5), (t, 0.9)], (100, 0.1, [1]))
              for k, t in enumerate([2.0, 4.0, 10.0])}
    at = speedup.job(method, alone, [0.9])["targets"]["0.90"]
    assert at["paired"]["per_seed"] == [2.0, None, 0.5]
    # interpolated: 0.9 is reached at the second evaluation exactly
    assert at["paired_crossing"]["per_seed"] == [2.0, None, 0.5]
    assert at["speedup"] == pytest.approx(5.0 / 4.0)
