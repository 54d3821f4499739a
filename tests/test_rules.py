"""The servers' aggregation rules, checked against hand computations and torch's SGD."""
import numpy as np
import pytest
import torch

from esync.rules import RuleConfig, make_rule


def _rule(name, weights, workers=2, **kw):
    w = np.array(weights, dtype=np.float32)
    return make_rule(w, np.zeros(2, np.float32), RuleConfig(name, workers, **kw)), w


def test_dcasgd_matches_hand_computation():
    rule, w = _rule("dcasgd", [1.0, 2.0, -1.0], lr=0.5, lamda=0.1)
    # worker 1 received w0 = [1, 2, -1] at init; meanwhile worker 0 moved the weights
    rule.add(0, 0, np.array([0.2, -0.4, 0.0], np.float32))   # w = [0.9, 2.2, -1.0]
    rule.sent(0)
    g = np.array([1.0, 2.0, -3.0], np.float32)
    rule.add(1, 0, g)
    # w <- w - lr * (g + lamda * g * g * (w - w_backup[1])), by hand:
    # drift = [0.9-1, 2.2-2, -1-(-1)] = [-0.1, 0.2, 0]
    # g + 0.1*g*g*drift = [1 - 0.01, 2 + 0.08, -3 + 0] = [0.99, 2.08, -3]
    # w = [0.9 - 0.495, 2.2 - 1.04, -1 + 1.5] = [0.405, 1.16, 0.5]
    np.testing.assert_allclose(w, [0.405, 1.16, 0.5], rtol=1e-6)


def test_dcasgd_backup_is_what_the_worker_last_received():
    rule, w = _rule("dcasgd", [1.0], lr=1.0, lamda=1.0)
    rule.add(0, 0, np.array([0.5], np.float32))  # w = 0.5
    rule.sent(1)                                  # worker 1 receives 0.5
    rule.add(0, 0, np.array([0.5], np.float32))  # w = 0.0
    rule.add(1, 0, np.array([1.0], np.float32))  # drift 0 - 0.5: g' = 1 + 1*1*(-0.5) = 0.5
    np.testing.assert_allclose(w, [-0.5])


def test_dcasgd_with_lamda_zero_equals_asgd():
    rng = np.random.default_rng(0)
    start = rng.normal(size=50).astype(np.float32)
    dc, w_dc = _rule("dcasgd", start, workers=3, lr=0.1, lamda=0.0, momentum=0.9,
                     weight_decay=0.01)
    asgd, w_asgd = _rule("async", start, workers=3, lr=0.1, momentum=0.9, weight_decay=0.01)
    for step in range(20):
        worker, g = step % 3, rng.normal(size=50).astype(np.float32)
        for rule in (dc, asgd):
            rule.add(worker, 0, g[:30])
            rule.add(worker, 30, g[30:])  # chunk by chunk, as frames arrive
            rule.sent(worker)
    np.testing.assert_array_equal(w_dc, w_asgd)


def test_server_sgd_equals_torch_sgd():
    rng = np.random.default_rng(1)
    start = rng.normal(size=40).astype(np.float32)
    rule, w = _rule("async", start, lr=0.05, momentum=0.9, weight_decay=0.001)
    p = torch.nn.Parameter(torch.tensor(start))
    opt = torch.optim.SGD([p], lr=0.05, momentum=0.9, weight_decay=0.001)
    for _ in range(10):
        g = rng.normal(size=40).astype(np.float32)
        rule.add(0, 0, g)
        p.grad = torch.tensor(g)
        opt.step()
    np.testing.assert_allclose(w, p.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_sync_waits_for_all_then_averages():
    w = np.array([1.0, 1.0], np.float32)
    b = np.zeros(2, np.float32)
    rule = make_rule(w, b, RuleConfig("sync", 2, lr=1.0))
    assert rule.check(0, 2) == "push for round 2, but the current round is 1"
    rule.add(0, 0, np.array([1.0, 3.0], np.float32))
    rule.add_buffers(0, 0, np.array([2.0, 4.0], np.float32))
    rule.pushed(0)
    assert rule.check(0, 1) == "worker 0 already pushed round 1"
    assert not rule.ready()
    np.testing.assert_array_equal(w, [1.0, 1.0])  # nothing applied before all arrived
    rule.add(1, 0, np.array([3.0, 1.0], np.float32))
    rule.add_buffers(1, 0, np.array([4.0, 6.0], np.float32))
    rule.pushed(1)
    assert rule.ready()
    rule.complete()
    np.testing.assert_array_equal(w, [-1.0, -1.0])  # 1 - mean([1,3],[3,1]) = 1 - 2
    np.testing.assert_array_equal(b, [3.0, 5.0])    # buffers averaged
    assert rule.check(0, 2) is None and not rule.ready()


def test_async_buffers_move_towards_each_worker():
    w, b = np.zeros(1, np.float32), np.array([0.0, 8.0], np.float32)
    rule = make_rule(w, b, RuleConfig("async", 4, lr=0.1))
    rule.add_buffers(2, 0, np.array([4.0, 0.0], np.float32))
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
