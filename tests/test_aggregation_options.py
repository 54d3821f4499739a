"""The aggregation options of the synchronous rules (esync.algorithms.rules) and the compressed
pushes a parameter server takes (esync.comm.server, esync.comm.compress).

1. ESyncRule (made by make_rule on numpy vectors, driven through `add` for every worker,
   in two weight chunks and one buffer chunk): the plain rule moves the weights by
   lr * mean(delta); `normalize` (FedNova) by lr * mean(steps) * mean(delta_i / steps_i)
   from the pushed delta_i / steps_i and `steps`; outer Nesterov momentum (DiLoCo) over
   several rounds matches torch.optim.SGD(lr, momentum=M, nesterov=True) stepping on the
   pseudo-gradient -mean(delta) (torch's own optimiser as the reference); buffers become
   the workers' mean (averaged by steps, weighted by them). SyncRule with momentum and weight decay matches torch's SGD on the
   mean gradient.
2. The all-reduce backend's path (`rule.steps = ...; rule.aggregate(key, sum, N)` on
   torch tensors) gives the same weights and buffers as the `add` path.
3. A real ShardServer (tests.test_wire_properties.Harness: real ROUTER/DEALER sockets)
   takes fp16, top-k and threshold pushes (with `steps`, normalised ESync; a chunk with
   nothing over the threshold travels empty) and gives the expected weights; over K
   rounds of partial:K pushes each round moves exactly its slice and every weight moves
   once; it answers malformed compressed pushes (and bad `steps`) with `error` and
   changes nothing.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import msgpack
import numpy as np
import pytest
import torch

from esync.comm.compress import Compression, Compressor, decode_chunk
from esync.algorithms.esync.rule import ESyncRule
from esync.algorithms.rules import BUFFERS, WEIGHTS, RuleConfig, SyncRule, make_rule
from esync.transport.message import CHUNK_VALUES, Message, encode
from tests.test_wire_properties import (LR, NUM_BUFFERS, NUM_WEIGHTS, WEIGHT_CHUNKS,
                                        Harness)

pytestmark = pytest.mark.filterwarnings(  # rules.py's own filter, reset by pytest
    "ignore:The given NumPy array is not writable")

N = 3
SIZE, SPLIT, NBUF = 11, 6, 4  # weights in two chunks: (0, 0..5) and (0, 6..10)
STEPS = [2, 5, 3]


def rounds_of(seed: int, count: int) -> List[Dict]:
    """`count` rounds of every worker's delta (or gradient) and buffers."""
    rng = np.random.default_rng(seed)
    return [{"deltas": rng.standard_normal((N, SIZE)).astype(np.float32),
             "buffers": rng.standard_normal((N, NBUF)).astype(np.float32)}
            for _ in range(count)]


def start() -> tuple:
    rng = np.random.default_rng(99)
    return rng.standard_normal(SIZE).astype(np.float32), \
        rng.standard_normal(NBUF).astype(np.float32)


def run_add(config: RuleConfig, rounds: List[Dict], steps: Optional[Sequence[int]] = None,
            normalize_pushes: bool = False):
    """Drive the rule of `config` through `add` for every worker, round after round;
    with `normalize_pushes` worker i pushes delta_i / steps_i (with config.by_steps,
    delta_i * steps_i, as the workers do). The rule at the end."""
    w0, b0 = start()
    rule = make_rule(w0.copy(), b0.copy(), config)
    for r, data in enumerate(rounds):
        for worker in range(N):
            pushed = data["deltas"][worker]
            if normalize_pushes:
                scale = steps[worker] if config.by_steps else 1 / steps[worker]
                pushed = (pushed * np.float32(scale)).astype(np.float32)
            s = None if steps is None else steps[worker]
            assert rule.check(worker, r + 1, (WEIGHTS, 0)) is None
            done = [rule.add(worker, (WEIGHTS, 0), pushed[:SPLIT].copy(), s),
                    rule.add(worker, (WEIGHTS, SPLIT), pushed[SPLIT:].copy(), s),
                    rule.add(worker, (BUFFERS, 0), data["buffers"][worker].copy(), s)]
            assert done == [worker == N - 1] * 3  # complete once the last worker pushed
        assert rule.updates == r + 1 and rule.round == r + 2 and rule.at_boundary
    return rule


def run_aggregate(config: RuleConfig, rounds: List[Dict],
                  steps: Optional[Sequence[int]] = None, normalize_pushes: bool = False):
    """The all-reduce backend's path (esync.comm.allreduce.AllReduce.push_pull): the rule on
    torch tensors, handed the all-reduced sums."""
    w0, b0 = start()
    weights, buffers = torch.from_numpy(w0.copy()), torch.from_numpy(b0.copy())
    rule = make_rule(weights, buffers, config)
    for data in rounds:
        pushed = torch.from_numpy(data["deltas"].copy())
        if normalize_pushes:
            k = torch.tensor(steps, dtype=torch.float32)[:, None]
            pushed = pushed * k if config.by_steps else pushed / k
        total = pushed.sum(0)
        buffers = torch.from_numpy(data["buffers"].copy())
        if config.by_steps and any(steps):  # each worker's buffers times its steps
            buffers = buffers * torch.tensor(steps, dtype=torch.float32)[:, None]
        control = buffers.sum(0)  # (AllReduce.push_pull)
        rule.steps = [float(s) for s in (steps or [1] * N)]
        rule.aggregate((WEIGHTS, 0), total, N)
        rule.aggregate((BUFFERS, 0), control, N)
    assert rule.updates == len(rounds)
    return rule


def weights_of(rule) -> np.ndarray:
    w = rule.weights
    return (w.numpy() if isinstance(w, torch.Tensor) else w).copy()


def buffers_of(rule) -> np.ndarray:
    b = rule.buffers
    return (b.numpy() if isinstance(b, torch.Tensor) else b).copy()


def buffers_mean(data: Dict, config: RuleConfig, steps: Optional[Sequence[int]]):
    """The buffers a round leaves: the workers' mean, averaged by steps weighted by them."""
    if not config.by_steps:
        return data["buffers"].mean(0)
    k = np.array(steps, np.float64)[:, None]
    return (k * data["buffers"]).sum(0) / k.sum()


def torch_reference(rounds: List[Dict], lr: float, momentum: float, nesterov: bool,
                    grad_of, weight_decay: float = 0.0) -> np.ndarray:
    """torch.optim.SGD's weights after one step per round on grad_of(round data)."""
    w0, _ = start()
    param = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = torch.optim.SGD([param], lr=lr, momentum=momentum, nesterov=nesterov,
                          weight_decay=weight_decay)
    for data in rounds:
        opt.zero_grad()
        param.grad = torch.from_numpy(np.asarray(grad_of(data), np.float32)).clone()
        opt.step()
    return param.detach().numpy().copy()


# --- 1. the `add` path --------------------------------------------------------------------
def test_esync_plain_average():
    rounds = rounds_of(0, 3)
    rule = run_add(RuleConfig("esync", N, lr=0.7), rounds)
    assert isinstance(rule, ESyncRule)
    w0, _ = start()
    expected = w0.astype(np.float64)
    for data in rounds:
        expected += 0.7 * data["deltas"].astype(np.float64).mean(0)
    np.testing.assert_allclose(weights_of(rule), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(buffers_of(rule), rounds[-1]["buffers"].mean(0),
                               rtol=1e-5, atol=1e-6)


def test_esync_plain_ignores_steps():
    """Without `normalize`, the steps a push says change nothing."""
    rounds = rounds_of(1, 2)
    with_steps = run_add(RuleConfig("esync", N, lr=0.7), rounds, steps=STEPS)
    without = run_add(RuleConfig("esync", N, lr=0.7), rounds)
    np.testing.assert_array_equal(weights_of(with_steps), weights_of(without))


def test_esync_normalize_fednova():
    rounds = rounds_of(2, 1)
    rule = run_add(RuleConfig("esync", N, lr=0.7, normalize=True), rounds, steps=STEPS,
                   normalize_pushes=True)
    w0, _ = start()
    deltas = rounds[0]["deltas"].astype(np.float64)
    per_step = deltas / np.array(STEPS, np.float64)[:, None]
    expected = w0 + 0.7 * np.mean(STEPS) * per_step.mean(0)
    np.testing.assert_allclose(weights_of(rule), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(buffers_of(rule), rounds[0]["buffers"].mean(0),
                               rtol=1e-5, atol=1e-6)
    # equal steps: FedNova is the plain average
    equal = run_add(RuleConfig("esync", N, lr=0.7, normalize=True), rounds, steps=[4] * N,
                    normalize_pushes=True)
    plain = run_add(RuleConfig("esync", N, lr=0.7), rounds)
    np.testing.assert_allclose(weights_of(equal), weights_of(plain), rtol=1e-6, atol=1e-6)


def test_esync_weight_by_steps():
    """Each delta weighs as its share of the round's local steps: w += lr * sum(k_i d_i) /
    sum(k_i); equal steps give the plain average."""
    rounds = rounds_of(3, 2)
    rule = run_add(RuleConfig("esync", N, lr=0.7, by_steps=True), rounds, steps=STEPS,
                   normalize_pushes=True)
    w0, _ = start()
    k = np.array(STEPS, np.float64)[:, None]
    expected = w0.astype(np.float64)
    for data in rounds:
        expected += 0.7 * (k * data["deltas"].astype(np.float64)).sum(0) / k.sum()
    np.testing.assert_allclose(weights_of(rule), expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(expected, w0 + 0.7 * sum(d["deltas"].mean(0) for d in rounds))
    equal = run_add(RuleConfig("esync", N, lr=0.7, by_steps=True), rounds, steps=[4] * N,
                    normalize_pushes=True)
    plain = run_add(RuleConfig("esync", N, lr=0.7), rounds)
    np.testing.assert_allclose(weights_of(equal), weights_of(plain), rtol=1e-6, atol=1e-6)


def test_esync_by_steps_weighs_the_buffers_as_their_steps():
    """Averaged by steps, BatchNorm's statistics are too: a worker that ran more local
    steps (its statistics the fresher) counts more, one that sat the round out (0 steps,
    its buffers the last round's) not at all; where every worker ran 0 steps (a round
    that measured speeds, each worker's statistics moved by its one batch), their plain
    mean, as the all-reduce's workers can take it too."""
    rounds = rounds_of(3, 2)
    rule = run_add(RuleConfig("esync", N, lr=0.7, by_steps=True), rounds, steps=STEPS,
                   normalize_pushes=True)
    k = np.array(STEPS, np.float64)[:, None]
    np.testing.assert_allclose(buffers_of(rule), (k * rounds[-1]["buffers"]).sum(0) / k.sum(),
                               rtol=1e-5, atol=1e-6)
    one_trains = run_add(RuleConfig("esync", N, lr=0.7, by_steps=True, anchored=True),
                         rounds[:1], steps=[0, 64, 0], normalize_pushes=True)
    np.testing.assert_allclose(buffers_of(one_trains), rounds[0]["buffers"][1], rtol=1e-6)
    none = run_add(RuleConfig("esync", N, lr=0.7, by_steps=True), rounds[:1],
                   steps=[0, 0, 0], normalize_pushes=True)
    np.testing.assert_allclose(buffers_of(none), rounds[0]["buffers"].mean(0), rtol=1e-6)


def test_esync_anchored_keeps_the_fastest_device_s_length():
    """--average anchored: the steps-weighted mean scaled by max(k) sum(k) / sum(k^2),
    i.e. w += lr * max(k) * sum(k_i d_i) / sum(k_i^2); equal steps give the plain
    average, and a device far faster than the others keeps nearly all its delta."""
    rounds = rounds_of(3, 2)
    config = RuleConfig("esync", N, lr=0.7, by_steps=True, anchored=True)
    rule = run_add(config, rounds, steps=STEPS, normalize_pushes=True)
    w0, _ = start()
    k = np.array(STEPS, np.float64)[:, None]
    expected = w0.astype(np.float64)
    for data in rounds:
        expected += 0.7 * k.max() * (k * data["deltas"].astype(np.float64)).sum(0) / \
            (k * k).sum()
    np.testing.assert_allclose(weights_of(rule), expected, rtol=1e-5, atol=1e-6)
    equal = run_add(config, rounds, steps=[4] * N, normalize_pushes=True)
    plain = run_add(RuleConfig("esync", N, lr=0.7), rounds)
    np.testing.assert_allclose(weights_of(equal), weights_of(plain), rtol=1e-6, atol=1e-6)
    fast = [64, 1, 1]  # its delta weighs 64^2 / (64^2 + 2) of itself
    one = run_add(config, rounds[:1], steps=fast, normalize_pushes=True)
    d = rounds[0]["deltas"].astype(np.float64)
    moved = weights_of(one) - w0
    np.testing.assert_allclose(moved, 0.7 * (64 * 64 * d[0] + 64 * (d[1] + d[2])) / 4098,
                               rtol=1e-5, atol=1e-6)


def test_esync_normalize_over_rounds_with_changing_steps():
    rounds = rounds_of(3, 3)
    steps_by_round = [[1, 1, 8], [3, 3, 3], [7, 2, 1]]
    w0, b0 = start()
    rule = make_rule(w0.copy(), b0.copy(), RuleConfig("esync", N, lr=0.3, normalize=True))
    expected = w0.astype(np.float64)
    for data, steps in zip(rounds, steps_by_round):
        for worker in range(N):
            pushed = data["deltas"][worker] / np.float32(steps[worker])
            rule.add(worker, (WEIGHTS, 0), pushed[:SPLIT].copy(), steps[worker])
            rule.add(worker, (WEIGHTS, SPLIT), pushed[SPLIT:].copy(), steps[worker])
            rule.add(worker, (BUFFERS, 0), data["buffers"][worker].copy())
        per_step = data["deltas"].astype(np.float64) / np.array(steps, np.float64)[:, None]
        expected += 0.3 * np.mean(steps) * per_step.mean(0)
        np.testing.assert_allclose(weights_of(rule), expected, rtol=1e-5, atol=1e-6)


def test_esync_normalize_without_steps_counts_one_step():
    rounds = rounds_of(4, 1)
    rule = run_add(RuleConfig("esync", N, lr=0.7, normalize=True), rounds)
    plain = run_add(RuleConfig("esync", N, lr=0.7), rounds)
    np.testing.assert_allclose(weights_of(rule), weights_of(plain), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("momentum", [0.5, 0.9])
def test_esync_outer_nesterov_momentum_matches_torch(momentum):
    rounds = rounds_of(5, 5)
    lr = 0.7
    rule = run_add(RuleConfig("esync", N, lr=lr, momentum=momentum), rounds)
    expected = torch_reference(rounds, lr, momentum, True,
                               lambda data: -data["deltas"].mean(0))
    np.testing.assert_allclose(weights_of(rule), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(buffers_of(rule), rounds[-1]["buffers"].mean(0),
                               rtol=1e-5, atol=1e-6)


def test_esync_momentum_with_normalize_matches_torch():
    """Both options: the pseudo-gradient is -mean(steps) * mean(delta_i / steps_i)."""
    rounds = rounds_of(6, 4)
    rule = run_add(RuleConfig("esync", N, lr=0.4, momentum=0.8, normalize=True), rounds,
                   steps=STEPS, normalize_pushes=True)
    weights = np.array(STEPS, np.float64)[:, None]
    expected = torch_reference(
        rounds, 0.4, 0.8, True,
        lambda data: -np.mean(STEPS) * (data["deltas"].astype(np.float64) / weights).mean(0))
    np.testing.assert_allclose(weights_of(rule), expected, rtol=1e-5, atol=1e-5)


def test_sync_rule_matches_torch_sgd():
    """SSGD (for comparison): torch's SGD (momentum, weight decay) on the mean gradient."""
    rounds = rounds_of(7, 4)
    rule = run_add(RuleConfig("sync", N, lr=0.1, momentum=0.9, weight_decay=0.01), rounds)
    assert type(rule) is SyncRule
    expected = torch_reference(rounds, 0.1, 0.9, False, lambda d: d["deltas"].mean(0),
                               weight_decay=0.01)
    np.testing.assert_allclose(weights_of(rule), expected, rtol=1e-5, atol=1e-5)


def test_rule_config_header_round_trip():
    config = RuleConfig("esync", N, lr=0.7, momentum=0.9, normalize=True)
    assert RuleConfig.from_header(config.to_header()) == config
    assert RuleConfig.from_header({"name": "esync", "num_workers": 2, "lr": 1}).normalize \
        is False
    by_steps = RuleConfig("esync", N, lr=0.7, by_steps=True)
    assert RuleConfig.from_header(by_steps.to_header()) == by_steps
    for bad in ({"normalize": 1}, {"normalize": "yes"}, {"momentum": 1.0}, {"by_steps": 1},
                {"normalize": True, "by_steps": True}, {"anchored": True},
                {"anchored": 1, "by_steps": True},
                {"momentum": -0.1}, {"momentum": float("nan")}):
        with pytest.raises(ValueError):
            RuleConfig.from_header({"name": "esync", "num_workers": 2, "lr": 1, **bad})


# --- 2. the all-reduce path: aggregate on torch tensors ------------------------------------
CASES = {
    "plain": (dict(lr=0.7), None, False),
    "normalize": (dict(lr=0.7, normalize=True), STEPS, True),
    "momentum": (dict(lr=0.7, momentum=0.9), None, False),
    "both": (dict(lr=0.4, momentum=0.8, normalize=True), STEPS, True),
    "by_steps": (dict(lr=0.7, by_steps=True), STEPS, True),
    "anchored": (dict(lr=0.7, by_steps=True, anchored=True), STEPS, True),
    "sync": (dict(lr=0.1, momentum=0.9, weight_decay=0.01), None, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_aggregate_on_tensors_matches_add(case):
    options, steps, normalize_pushes = CASES[case]
    name = "sync" if case == "sync" else "esync"
    config = RuleConfig(name, N, **options)
    rounds = rounds_of(8, 4)
    by_add = run_add(config, rounds, steps, normalize_pushes)
    by_sum = run_aggregate(config, rounds, steps, normalize_pushes)
    assert isinstance(by_sum.weights, torch.Tensor)
    np.testing.assert_allclose(weights_of(by_sum), weights_of(by_add), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(buffers_of(by_sum), buffers_of(by_add), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(buffers_of(by_sum), buffers_mean(rounds[-1], config, steps),
                               rtol=1e-5, atol=1e-6)


# --- 3. a real server: compressed pushes --------------------------------------------------
class OptionsHarness(Harness):
    """Harness whose `init` carries extra rule options (normalize, momentum)."""

    def __init__(self, rule: str, **options):
        self.options = options
        super().__init__(rule)

    def config(self, **change) -> Dict:
        return super().config(**{**self.options, **change})


@pytest.fixture
def make_harness():
    made: List[Harness] = []

    def make(rule: str, **options) -> Harness:
        made.append(OptionsHarness(rule, **options))
        return made[-1]
    yield make
    for h in made:
        h.close()


IDENTITY = {0: b"worker-a/kv", 1: b"worker-b/kv"}


def push_frames(rank: int, section: int, offset: int, fields: Dict, sections: list,
                round_: int = 1, **extra) -> list:
    return encode({"type": "push", "sender": rank, "shard": 0, "round": round_,
                   "section": section, "offset": offset, **fields, **extra}, sections)


def push_round(h: Harness, pushed: Sequence[np.ndarray], buffers: Sequence[np.ndarray],
               compression: Compression, steps: Optional[Sequence[int]] = None,
               round_: int = 1) -> Dict[int, List[Message]]:
    """Every worker pushes its vector, chunk by chunk, compressed as `compression` says;
    returns each worker's answers collected while it pushed, and what the server decoded
    per worker (as `decoded`, dense float32)."""
    answers: Dict[int, List[Message]] = {}
    h.decoded = []
    for rank, (vector, buf) in enumerate(zip(pushed, buffers)):
        compressor = Compressor(compression, NUM_WEIGHTS)
        compressor.begin(round_)
        extra = {} if steps is None else {"steps": steps[rank]}
        got, decoded = [], np.empty(NUM_WEIGHTS, np.float32)
        for offset, length in WEIGHT_CHUNKS:
            fields, sections = compressor.encode(offset, vector[offset:offset + length])
            decoded[offset:offset + length] = decode_chunk(fields, sections, length)
            got += h.send(IDENTITY[rank], push_frames(rank, 0, offset, fields, sections,
                                                      round_, **extra))
        got += h.send(IDENTITY[rank], push_frames(rank, 1, 0, {}, [buf], round_, **extra))
        assert all(a.type == "weights" for a in got), [a.header for a in got]
        answers[rank] = got
        h.decoded.append(decoded)
    return answers


def assembled(answers: List[Message]) -> tuple:
    w, b = np.full(NUM_WEIGHTS, np.nan, np.float32), np.full(NUM_BUFFERS, np.nan, np.float32)
    for a in answers:
        target = w if a.header["section"] == 0 else b
        values = a.sections()[0][0][1]
        target[a.header["offset"]:a.header["offset"] + len(values)] = values
    return w, b


def some_vectors(seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    pushed = [rng.standard_normal(NUM_WEIGHTS).astype(np.float32) for _ in range(2)]
    buffers = [rng.standard_normal(NUM_BUFFERS).astype(np.float32) for _ in range(2)]
    return pushed, buffers


@pytest.mark.parametrize("rule", ["sync", "esync"])
def test_server_takes_fp16_pushes(make_harness, rule):
    h = make_harness(rule)
    pushed, buffers = some_vectors(10)
    answers = push_round(h, pushed, buffers, Compression.parse("fp16"))
    halves = [v.astype(np.float16).astype(np.float32) for v in pushed]
    for got, half in zip(h.decoded, halves):
        np.testing.assert_array_equal(got, half)
    mean = (halves[0].astype(np.float64) + halves[1]) / 2
    sign = -1.0 if rule == "sync" else 1.0  # SSGD steps against the gradient
    expected = h.weights0 + sign * LR * mean
    np.testing.assert_allclose(h.server.sections[0], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(h.server.sections[1], (buffers[0] + buffers[1]) / 2,
                               rtol=1e-6, atol=1e-7)
    # worker 1 completed every chunk: its answers hold the new weights and buffers
    w, b = assembled(answers[1])
    np.testing.assert_array_equal(w, h.server.sections[0])
    np.testing.assert_array_equal(b, h.server.sections[1])
    assert h.server.updates == 1


def test_server_takes_topk_pushes_with_steps(make_harness):
    """Normalised ESync with top-k pushes of delta_i / steps_i and `steps`."""
    h = make_harness("esync", normalize=True)
    deltas, buffers = some_vectors(11)
    steps = [2, 6]
    pushed = [d / np.float32(s) for d, s in zip(deltas, steps)]
    answers = push_round(h, pushed, buffers, Compression.parse("topk:0.01"), steps=steps)
    kept = sum(Compression.parse("topk:0.01").kept(n) for _, n in WEIGHT_CHUNKS)
    for got in h.decoded:
        assert np.count_nonzero(got) == kept
    mean = (h.decoded[0].astype(np.float64) + h.decoded[1]) / 2
    expected = h.weights0 + LR * np.mean(steps) * mean
    np.testing.assert_allclose(h.server.sections[0], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(h.server.sections[1], (buffers[0] + buffers[1]) / 2,
                               rtol=1e-6, atol=1e-7)
    w, _ = assembled(answers[1])
    np.testing.assert_array_equal(w, h.server.sections[0])
    # only the sent coordinates moved
    moved = h.server.sections[0] != h.weights0
    assert not moved[(h.decoded[0] == 0) & (h.decoded[1] == 0)].any()


def test_server_takes_threshold_pushes_and_empty_chunks(make_harness):
    """SSGD with threshold pushes: the second chunk (1000 values) of worker 0 holds
    nothing over the threshold and travels as an empty section."""
    h = make_harness("sync")
    pushed, buffers = some_vectors(14)
    off = WEIGHT_CHUNKS[1][0]
    pushed[0][off:] = 0.25
    answers = push_round(h, pushed, buffers, Compression.parse("threshold:1.5"))
    for got, vector in zip(h.decoded, pushed):
        np.testing.assert_array_equal(got, np.where(np.abs(vector) > 1.5, vector, 0))
    assert not h.decoded[0][off:].any() and h.decoded[1][off:].any()
    mean = (h.decoded[0].astype(np.float64) + h.decoded[1]) / 2
    np.testing.assert_allclose(h.server.sections[0], h.weights0 - LR * mean,
                               rtol=1e-6, atol=1e-6)
    w, _ = assembled(answers[1])
    np.testing.assert_array_equal(w, h.server.sections[0])
    assert h.server.updates == 1


@pytest.mark.parametrize("rule", ["sync", "esync"])
def test_partial_pushes_move_one_slice_a_round_and_each_once_in_k(make_harness, rule):
    """partial:3 over 3 rounds, the slices crossing the chunks' boundary: each round the
    server's weights move exactly in the round's slice, by the rule's step on the mean,
    and after the 3 rounds every weight has moved once."""
    k = 3
    compression = Compression.parse(f"partial:{k}")
    h = make_harness(rule)
    moved = np.zeros(NUM_WEIGHTS, int)
    sign = -1.0 if rule == "sync" else 1.0
    for round_ in range(1, k + 1):
        lo, hi = compression.window(round_, NUM_WEIGHTS)
        pushed, buffers = some_vectors(20 + round_)
        before = h.server.sections[0].copy()
        answers = push_round(h, pushed, buffers, compression, round_=round_)
        after = h.server.sections[0]
        mean = (pushed[0][lo:hi].astype(np.float64) + pushed[1][lo:hi]) / 2
        np.testing.assert_allclose(after[lo:hi], before[lo:hi] + sign * LR * mean,
                                   rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(np.delete(after, np.s_[lo:hi]),
                                      np.delete(before, np.s_[lo:hi]))
        moved += after != before
        w, _ = assembled(answers[1])
        np.testing.assert_array_equal(w, after)
        assert h.server.updates == round_
    assert (moved == 1).all(), np.flatnonzero(moved != 1)[:10]
    lo, hi = compression.window(k, NUM_WEIGHTS)
    assert lo < CHUNK_VALUES < hi  # the last slice spans both chunks


def test_server_takes_topk_pushes_in_async(make_harness):
    h = make_harness("async")
    pushed, buffers = some_vectors(12)
    push_round(h, pushed[:1], buffers[:1], Compression.parse("topk:0.5"))
    np.testing.assert_allclose(h.server.sections[0], h.weights0 - LR * h.decoded[0],
                               rtol=1e-6, atol=1e-6)


def malformed_pushes() -> List[tuple]:
    """(name, frames, what the error says) of compressed pushes a worker could get wrong
    (worker 0, round 1; the short chunk is the second weight chunk, of 1000 values)."""
    off, n = WEIGHT_CHUNKS[1]
    good_idx, good_val = np.array([0, 5], np.int32), np.ones(2, np.float32)

    def topk(index, values, section=0, offset=off, **extra):
        return push_frames(0, section, offset, {"codec": "topk"}, [index, values], **extra)

    def fp16(values, section=0, offset=off, **extra):
        return push_frames(0, section, offset, {"codec": "fp16"}, [values], **extra)

    plain = np.ones(n, np.float32)
    raw_header = {"type": "push", "sender": 0, "shard": 0, "round": 1, "section": 0,
                  "offset": off, "codec": "topk", "dtype": ["int32", "float32"],
                  "lengths": [2, 2], "frames": [1, 1]}
    return [
        ("index == length", topk(np.array([0, n], np.int32), good_val), "indices must be in"),
        ("index beyond the shard", topk(np.array([0, 2**31 - 1], np.int32), good_val),
         "indices must be in"),
        ("index of the first chunk's length", topk(np.array([CHUNK_VALUES], np.int32),
                                                   np.ones(1, np.float32), offset=0),
         "indices must be in"),
        ("negative index", topk(np.array([-1, 3], np.int32), good_val), "indices must be in"),
        ("more indices than the chunk", topk(np.arange(n + 1, dtype=np.int32) % n,
                                             np.ones(n + 1, np.float32)), f"at most {n}"),
        ("float32 indices", topk(good_idx.astype(np.float32), good_val), "int32 indices"),
        ("float16 values", topk(good_idx, good_val.astype(np.float16)), "float32 values"),
        ("int32 values", topk(good_idx, good_idx), "float32 values"),
        ("fewer values", topk(good_idx, np.ones(1, np.float32)), "as many"),
        ("more values", topk(good_idx, np.ones(3, np.float32)), "as many"),
        ("topk of one section", push_frames(0, 0, off, {"codec": "topk"}, [good_idx]),
         "int32 indices"),
        ("topk of three sections", push_frames(0, 0, off, {"codec": "topk"},
                                               [good_idx, good_val, good_val]), "one chunk"),
        ("fp16 codec, float32 values", fp16(plain), "one section of float16"),
        ("fp16 too short", fp16(np.ones(n - 1, np.float16)), f"chunk of {n - 1} values"),
        ("fp16 too long", fp16(np.ones(n + 1, np.float16)), f"chunk of {n + 1} values"),
        ("fp16 of the first chunk's length at the second",
         fp16(np.ones(CHUNK_VALUES, np.float16)), "values, expected 1000"),
        ("fp16 two sections", push_frames(0, 0, off, {"codec": "fp16"},
                                          [np.ones(500, np.float16)] * 2), "one section"),
        ("float16 without codec", push_frames(0, 0, off, {}, [np.ones(n, np.float16)]),
         "one section of float32"),
        ("two sections without codec", push_frames(0, 0, off, {}, [plain, plain]),
         "one section of float32"),
        ("unknown codec", push_frames(0, 0, off, {"codec": "zstd"}, [plain]),
         "unknown codec 'zstd'"),
        ("codec of another type", push_frames(0, 0, off, {"codec": 7}, [plain]),
         "unknown codec"),
        ("fp16 buffers", fp16(np.ones(NUM_BUFFERS, np.float16), section=1, offset=0),
         "only weight chunks"),
        ("topk buffers", topk(np.array([1], np.int32), np.ones(1, np.float32), section=1,
                              offset=0), "only weight chunks"),
        ("topk, header says float32 indices",
         [msgpack.packb({**raw_header, "dtype": "float32"}), good_idx.tobytes(),
          good_val.tobytes()], "int32 indices"),
        ("topk, header says float16 values",
         [msgpack.packb({**raw_header, "dtype": ["int32", "float16"], "lengths": [2, 4]}),
          good_idx.tobytes(), good_val.tobytes()], "float32 values"),
        ("topk, frames short of the lengths",
         [msgpack.packb({**raw_header, "lengths": [3, 2]}), good_idx.tobytes(),
          good_val.tobytes()], "its frames hold 8 bytes"),
        ("topk at a misplaced offset", topk(good_idx, good_val, offset=off + 1),
         "does not fit"),
        ("compressed push of a later round", topk(good_idx, good_val, round_=2),
         "current round is 1"),
        ("threshold index == length", push_frames(0, 0, off, {"codec": "threshold"},
                                                  [np.array([n], np.int32), good_val[:1]]),
         "threshold indices must be in"),
        ("slice past the chunk's end", push_frames(0, 0, off, {"codec": "slice",
                                                               "start": n - 1},
                                                   [np.ones(2, np.float32)]),
         "'start' must be an integer in 0..998"),
        ("slice without a start", push_frames(0, 0, off, {"codec": "slice"},
                                              [np.ones(2, np.float32)]), "'start'"),
        ("slice at a negative start", push_frames(0, 0, off, {"codec": "slice",
                                                              "start": -1},
                                                  [np.ones(2, np.float32)]), "'start'"),
        ("slice of float16 values", push_frames(0, 0, off, {"codec": "slice", "start": 0},
                                                [np.ones(2, np.float16)]),
         "one section of float32"),
        ("slice longer than the chunk", push_frames(0, 0, off, {"codec": "slice",
                                                                "start": 0},
                                                    [np.ones(n + 1, np.float32)]),
         "'start' must be an integer in 0..-1"),
        ("slice of buffers", push_frames(0, 1, 0, {"codec": "slice", "start": 0},
                                         [np.ones(2, np.float32)]), "only weight chunks"),
        ("empty section announced with a frame",
         [msgpack.packb({**raw_header, "lengths": [0, 0]}), b"", b""], "one chunk"),
    ]


BAD_STEPS = [0, -1, 2**31 + 1, 1.5, "3", True, [2], {"n": 2}]


@pytest.mark.parametrize("rule", ["sync", "esync"])
def test_server_refuses_malformed_compressed_pushes(make_harness, rule):
    h = make_harness(rule, **({"normalize": True} if rule == "esync" else {}))
    for name, frames, problem in malformed_pushes():
        answers = h.send(b"worker-a/kv", frames)
        assert [a.type for a in answers] == ["error"], (name, [a.header for a in answers])
        assert problem in answers[0].header["error"], (name, answers[0].header["error"])
        assert h.unchanged(), name
        assert h.state() == h.saved_state, name
    for steps in BAD_STEPS:
        frames = push_frames(0, 0, 0, {"codec": "fp16"}, [np.ones(CHUNK_VALUES, np.float16)],
                             steps=steps)
        answers = h.send(b"worker-a/kv", frames)
        assert [a.type for a in answers] == ["error"], (steps, [a.header for a in answers])
        assert "'steps'" in answers[0].header["error"]
        assert h.unchanged() and h.state() == h.saved_state, steps
    # nothing was held: a valid compressed round still gives exactly what it should
    pushed, buffers = some_vectors(13)
    steps = [3, 1] if rule == "esync" else None
    if rule == "esync":
        pushed = [p / np.float32(s) for p, s in zip(pushed, steps)]
    push_round(h, pushed, buffers, Compression.parse("topk:0.01"), steps=steps)
    mean = (h.decoded[0].astype(np.float64) + h.decoded[1]) / 2
    expected = h.weights0 + (LR * 2.0 * mean if rule == "esync" else -LR * mean)
    np.testing.assert_allclose(h.server.sections[0], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(h.server.sections[1], (buffers[0] + buffers[1]) / 2,
                               rtol=1e-6, atol=1e-7)
    assert h.server.updates == 1


def test_a_push_refused_for_its_steps_does_not_end_the_job(make_harness):
    h = make_harness("esync", normalize=True)
    frames = push_frames(0, 0, 0, {"codec": "fp16"}, [np.ones(CHUNK_VALUES, np.float16)],
                         steps=0, stop="attacker")
    answers = h.send(b"worker-a/kv", frames)
    assert [a.type for a in answers] == ["error"]
    assert h.server.stop_reason is None
