"""The servers' aggregation rules, checked against hand computations and torch's SGD."""
import numpy as np
import pytest
import torch

from esync.algorithms.rules import BUFFERS, WEIGHTS, RuleConfig, make_rule


def _rule(name, weights, workers=2, buffers=(0.0, 0.0), **kw):
    w, b = np.array(weights, dtype=np.float32), np.array(buffers, dtype=np.float32)
    return make_rule(w, b, RuleConfig(name, workers, **kw)), w, b


def _f32(*values):
    return np.array(values, dtype=np.float32)


def test_dcasgd_matches_hand_computation():
    rule, w, _ = _rule("dcasgd", [1.0, 2.0, -1.0], lr=0.5, lamda=0.1)
    # worker 1 received w0 = [1, 2, -1] at init; meanwhile worker 0 moved the weights
    assert rule.add(0, (WEIGHTS, 0), _f32(0.2, -0.4, 0.0))   # w = [0.9, 2.2, -1.0]
    rule.sent(0, (WEIGHTS, 0), 3)
    rule.add(1, (WEIGHTS, 0), _f32(1.0, 2.0, -3.0))
    # w <- w - lr * (g + lamda * g * g * (w - w_backup[1])), by hand:
    # drift = [0.9-1, 2.2-2, -1-(-1)] = [-0.1, 0.2, 0]
    # g + 0.1*g*g*drift = [1 - 0.01, 2 + 0.08, -3 + 0] = [0.99, 2.08, -3]
    # w = [0.9 - 0.495, 2.2 - 1.04, -1 + 1.5] = [0.405, 1.16, 0.5]
    np.testing.assert_allclose(w, [0.405, 1.16, 0.5], rtol=1e-6)


def test_dcasgd_backup_is_what_the_worker_last_received():
    rule, w, _ = _rule("dcasgd", [1.0], lr=1.0, lamda=1.0)
    rule.add(0, (WEIGHTS, 0), _f32(0.5))  # w = 0.5
    rule.sent(1, (WEIGHTS, 0), 1)         # worker 1 receives 0.5
    rule.add(0, (WEIGHTS, 0), _f32(0.5))  # w = 0.0
    rule.add(1, (WEIGHTS, 0), _f32(1.0))  # drift 0 - 0.5: g' = 1 + 1*1*(-0.5) = 0.5
    np.testing.assert_allclose(w, [-0.5])


def test_dcasgd_with_lamda_zero_equals_asgd():
    rng = np.random.default_rng(0)
    start = rng.normal(size=50).astype(np.float32)
    dc, w_dc, _ = _rule("dcasgd", start, workers=3, lr=0.1, lamda=0.0, momentum=0.9,
                        weight_decay=0.01)
    asgd, w_asgd, _ = _rule("async", start, workers=3, lr=0.1, momentum=0.9,
                            weight_decay=0.01)
    for step in range(20):
        worker, g = step % 3, rng.normal(size=50).astype(np.float32)
        for rule in (dc, asgd):
            rule.add(worker, (WEIGHTS, 0), g[:30])
            rule.add(worker, (WEIGHTS, 30), g[30:])  # chunk by chunk, as they arrive
            rule.sent(worker, (WEIGHTS, 0), 30)
            rule.sent(worker, (WEIGHTS, 30), 20)
    np.testing.assert_array_equal(w_dc, w_asgd)


@pytest.mark.parametrize("workers", [1, 3])
def test_server_sgd_equals_torch_sgd_on_the_mean_gradient(workers):
    rng = np.random.default_rng(1)
    start = rng.normal(size=40).astype(np.float32)
    name = "sync" if workers > 1 else "async"
    rule, w, _ = _rule(name, start, workers=workers, lr=0.05, momentum=0.9, weight_decay=0.001)
    p = torch.nn.Parameter(torch.tensor(start))
    opt = torch.optim.SGD([p], lr=0.05, momentum=0.9, weight_decay=0.001)
    for _ in range(10):
        grads = [rng.normal(size=40).astype(np.float32) for _ in range(workers)]
        done = [rule.add(k, (WEIGHTS, 0), g) for k, g in enumerate(grads)]
        assert done == [False] * (workers - 1) + [True]
        p.grad = torch.tensor(np.mean(grads, axis=0))
        opt.step()
    np.testing.assert_allclose(w, p.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_sync_waits_for_all_then_averages():
    rule, w, b = _rule("sync", [1.0, 1.0], workers=2, lr=1.0)
    assert rule.check(0, 2, (WEIGHTS, 0)) == "push for round 2, but the current round is 1"
    assert rule.add(0, (WEIGHTS, 0), _f32(1.0, 3.0)) is False
    assert rule.add(0, (BUFFERS, 0), _f32(2.0, 4.0)) is False
    assert rule.check(0, 1, (WEIGHTS, 0)) == "worker 0 already pushed chunk (0, 0) of round 1"
    np.testing.assert_array_equal(w, [1.0, 1.0])  # nothing applied before all arrived
    assert rule.add(1, (WEIGHTS, 0), _f32(3.0, 1.0)) is True
    np.testing.assert_array_equal(w, [-1.0, -1.0])  # 1 - mean([1,3],[3,1]) = 1 - 2
    assert rule.round == 1  # the buffers' chunk is still open
    assert rule.add(1, (BUFFERS, 0), _f32(4.0, 6.0)) is True
    np.testing.assert_array_equal(b, [3.0, 5.0])    # buffers averaged
    assert rule.round == 2 and rule.check(0, 2, (WEIGHTS, 0)) is None


def test_sync_holds_pushed_values_without_copying_them():
    rule, w, _ = _rule("sync", [0.0, 0.0], workers=2, lr=1.0)
    first = _f32(2.0, 2.0)
    rule.add(0, (WEIGHTS, 0), first)
    rule.add(1, (WEIGHTS, 0), _f32(4.0, 0.0))
    np.testing.assert_array_equal(first, [2.0, 2.0])  # pushed values are never written
    np.testing.assert_array_equal(w, [-3.0, -1.0])


def test_async_buffers_move_towards_each_worker():
    rule, _, b = _rule("async", [0.0], workers=4, buffers=(0.0, 8.0), lr=0.1)
    assert rule.add(2, (BUFFERS, 0), _f32(4.0, 0.0)) is True
    np.testing.assert_array_equal(b, [1.0, 6.0])


@pytest.mark.parametrize("header,problem", [
    ({"name": "adam", "num_workers": 2, "lr": 0.1}, "unknown rule 'adam'"),
    ({"name": "sync", "num_workers": 0, "lr": 0.1}, "'num_workers' must be a positive"),
    ({"name": "sync", "num_workers": 2, "lr": "fast"}, "'lr' must be a finite number"),
    ({"name": "sync", "num_workers": 2, "lr": -1.0}, "'lr' must be a finite number"),
    ([1, 2], "'rule' must be a map"),
])
def test_rule_config_from_a_bad_header(header, problem):
    with pytest.raises(ValueError, match=problem):
        RuleConfig.from_header(header)


@pytest.mark.parametrize("global_lr", [1.0, 0.5])
def test_esync_moves_the_weights_by_the_scaled_mean_delta(global_lr):
    rule, w, b = _rule("esync", [1.0, 2.0], workers=3, buffers=(0.0,), lr=global_lr)
    deltas = [_f32(0.3, -0.6), _f32(0.0, 0.3), _f32(-0.9, 0.0)]  # mean (-0.2, -0.1)
    assert [rule.add(k, (WEIGHTS, 0), d) for k, d in enumerate(deltas)] == [False, False, True]
    np.testing.assert_allclose(w, [1.0 - 0.2 * global_lr, 2.0 - 0.1 * global_lr], rtol=1e-6)
    for k, value in enumerate((1.0, 2.0, 6.0)):
        rule.add(k, (BUFFERS, 0), _f32(value))
    np.testing.assert_allclose(b, [3.0])  # BatchNorm statistics: the workers' mean
    assert rule.round == 2


# --- workers that die and come back ---------------------------------------------------
def test_sync_goes_on_with_the_living_workers_when_one_dies():
    """The round in progress completes with the survivors' mean; later rounds too."""
    w = _f32(0.0, 0.0)
    rule = make_rule(w, _f32(0.0), RuleConfig("sync", 3, lr=1.0))
    assert rule.add(0, (WEIGHTS, 0), _f32(1.0, 2.0)) is False
    assert rule.add(1, (WEIGHTS, 0), _f32(3.0, 4.0)) is False
    assert rule.leave(2) == [(WEIGHTS, 0)]  # nobody waits for worker 2's push
    np.testing.assert_allclose(w, [-2.0, -3.0])  # the mean of the two pushes
    assert rule.check(2, 1, (BUFFERS, 0)) is not None  # the dead take no part
    rule.add(0, (BUFFERS, 0), _f32(2.0))
    assert rule.add(1, (BUFFERS, 0), _f32(4.0)) is True
    assert rule.round == 2 and rule.members == {0, 1}


def test_a_worker_rejoins_at_a_round_that_has_not_begun():
    w = _f32(0.0)
    rule = make_rule(w, _f32(0.0), RuleConfig("esync", 2, lr=1.0))
    rule.leave(1)
    assert rule.join(1, 3) is True and not rule.joined(1, 3)
    for round_ in (1, 2):  # worker 0 alone
        rule.add(0, (WEIGHTS, 0), _f32(1.0))
        rule.add(0, (BUFFERS, 0), _f32(1.0))
    assert rule.round == 3 and rule.joined(1, 3) and rule.members == {0, 1}
    assert rule.add(0, (WEIGHTS, 0), _f32(1.0)) is False  # round 3 waits for worker 1
    assert rule.add(1, (WEIGHTS, 0), _f32(3.0)) is True
    np.testing.assert_allclose(w, [1.0 + 1.0 + 2.0])
    # a round already under way cannot be joined: the worker asks for a later one
    rule.leave(1)
    assert rule.join(1, 3) is False


def test_a_restored_sync_shard_takes_its_round_from_the_workers():
    rule = make_rule(_f32(0.0), _f32(0.0), RuleConfig("sync", 2, lr=1.0))
    rule.restore({}, {"next_round": 11}, [0, 1])
    assert rule.move_to(15) == [] and rule.round == 15  # the workers got further
    assert rule.late(0, 14)  # one that missed a round catches up
    rule.add(0, (WEIGHTS, 0), _f32(1.0))
    assert rule.move_to(16) == [(WEIGHTS, 0)]  # its held push is answered, not taken


def test_dcasgd_drops_a_dead_workers_backup():
    w = _f32(1.0)
    rule = make_rule(w, _f32(0.0), RuleConfig("dcasgd", 2, lr=1.0, lamda=1.0))
    rule.leave(1)
    assert rule.backup[1] is None
    rule.add(1, (WEIGHTS, 0), _f32(0.5))  # back, nothing sent yet: plain ASGD
    np.testing.assert_allclose(w, [0.5])
    rule.sent(1, (WEIGHTS, 0), 1)
    np.testing.assert_allclose(rule.backup[1].numpy(), [0.5])
