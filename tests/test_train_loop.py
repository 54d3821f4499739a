"""The one training loop (esync.runtime.train.train on esync.runtime.session's rounds, the public API's
machinery), driven in this process by a tiny algorithm that records what the loop asks
of it: the hooks' order, budgets, phases, evaluation,
stop agreement, traffic and clean-up, with real data, a real network and real logs."""
from __future__ import annotations

import json
import logging
import os
from typing import Dict, List, Optional, Tuple

import pytest
import torch

from esync.algorithms.base import Algorithm
from esync.models import build_network
from esync.logs.recorder import Recorder
from esync.runtime.session import Session
from esync.infra.stop import StopCriteria
from esync.runtime.task import load_task
from esync.runtime.train import train

CPU = torch.device("cpu")


class Scripted(Algorithm):
    """Round r has budgets[r - 1] local iterations (the last value repeats); plain SGD;
    evaluates where `evaluate_rounds` says; 100 bytes out and 10 in per round."""

    name = "scripted"

    def __init__(self, budgets=(1,), evaluate_rounds=(), decides_stop=True,
                 hold_stop_rounds=0, fail_in_round=None):
        self.budgets = list(budgets)
        self.evaluate_rounds = set(evaluate_rounds)
        self._decides_stop = decides_stop
        self.hold_stop_rounds = hold_stop_rounds  # agree to stop only this many rounds later
        self.fail_in_round = fail_in_round
        self.calls: List[Tuple] = []
        self.sent = self.received = 0
        self.optimizer: Optional[torch.optim.Optimizer] = None

    def setup(self, model, device):
        self.calls.append(("setup",))

    def begin_round(self, round_):
        self.calls.append(("begin_round", round_))
        self.round = round_
        return self.budgets[min(round_, len(self.budgets)) - 1], {"asking": 0.001}

    def local_update(self, model, step):
        self.calls.append(("local_update", self.round))
        if self.round == self.fail_in_round:
            raise RuntimeError("the algorithm broke")
        return step()

    def end_round(self, round_, model):
        self.calls.append(("end_round", round_))
        self.sent, self.received = self.sent + 100, self.received + 10
        return {"aggregating": 0.002}

    def evaluates(self, round_):
        return round_ in self.evaluate_rounds

    def round_record(self):
        return {"budget": self.budgets[min(self.round, len(self.budgets)) - 1]}

    @property
    def decides_stop(self):
        return self._decides_stop

    def agree_stop(self, reason, everyone=False):
        if reason is None:
            return None
        self.calls.append(("asked to stop", self.round))
        if self.hold_stop_rounds:
            self.hold_stop_rounds -= 1
            return None
        return reason

    def traffic(self):
        return self.sent, self.received

    def finish(self):
        self.calls.append(("finish",))


@pytest.fixture(scope="module")
def digits():
    return load_task("digits", "unused")


def run_loop(tmp_path, digits, algorithm, stop, batch_size=64):
    torch.manual_seed(0)
    with Session(algorithm, Recorder(str(tmp_path), "host", "dev"), stop, CPU) as session:
        result = train(session, build_network("lenet"), digits, batch_size, lr=0.05)
    return result, _records(tmp_path)


def _records(tmp_path) -> List[Dict]:
    folder = os.path.join(str(tmp_path), "host", "dev")
    count = len([f for f in os.listdir(folder) if f.startswith("iter-")])
    return [json.load(open(os.path.join(folder, f"iter-{n}.json"))) for n in range(1, count + 1)]


def test_hooks_are_called_in_order_with_the_algorithms_budgets(tmp_path, digits):
    algorithm = Scripted(budgets=[1, 3, 2])
    result, records = run_loop(tmp_path, digits, algorithm, StopCriteria(max_rounds=3))
    assert algorithm.calls == [
        ("setup",),
        ("begin_round", 1), ("local_update", 1), ("end_round", 1),
        ("begin_round", 2), *[("local_update", 2)] * 3, ("end_round", 2),
        ("begin_round", 3), *[("local_update", 3)] * 2, ("end_round", 3),
        ("asked to stop", 3), ("finish",)]
    assert (result.rounds, result.iterations, result.stop_reason) == \
        (3, 6, "finished 3 rounds")
    assert [len(r["time"]) for r in records] == [1, 3, 2]
    assert [r["budget"] for r in records] == [1, 3, 2]  # round_record's extra fields
    assert [r["num_samples"] for r in records] == [64, 192, 128]
    second = records[1]["time"]
    # begin_round's phases go to the first local iteration, end_round's to the last
    assert "asking" in second["0"] and "asking" not in second["1"]
    assert "aggregating" in second["2"] and "aggregating" not in second["0"]
    for phases in second.values():
        assert {"get_batch", "forward and backward", "local update"} <= set(phases)
    # traffic is logged per round, not cumulatively
    assert [(r["bytes_sent"], r["bytes_received"]) for r in records] == [(100, 10)] * 3


def test_only_rounds_the_algorithm_evaluates_have_an_accuracy(tmp_path, digits, caplog):
    caplog.set_level(logging.INFO, logger="esync")
    algorithm = Scripted(evaluate_rounds={2, 4})
    result, records = run_loop(tmp_path, digits, algorithm, StopCriteria(max_rounds=5))
    assert [("accuracy" in r) for r in records] == [False, True, False, True, False]
    assert result.accuracy == records[3]["accuracy"]
    lines = [r.getMessage() for r in caplog.records if "test accuracy" in r.getMessage()]
    assert len(lines) == 3  # one per evaluation, and the closing line
    assert lines[0].startswith("[scripted] round 2 iteration 2 ")
    assert lines[-1].startswith("[scripted] finished 5 rounds after 5 rounds, 5 iterations")


def test_the_algorithm_has_the_last_word_on_stopping(tmp_path, digits):
    """Distributed algorithms agree on the stop with the others: the loop goes on while
    agree_stop says no, even though its own criterion holds."""
    algorithm = Scripted(hold_stop_rounds=2)
    result, records = run_loop(tmp_path, digits, algorithm, StopCriteria(max_rounds=2))
    assert result.rounds == 4 and len(records) == 4
    assert [c for c in algorithm.calls if c[0] == "asked to stop"] == \
        [("asked to stop", 2), ("asked to stop", 3), ("asked to stop", 4)]


def test_an_epoch_limit_cuts_a_round_short_only_where_this_process_decides(tmp_path, digits):
    # 1438 samples, batches of 100: the epoch ends within the 15th iteration
    own = Scripted(budgets=[10])
    result, records = run_loop(tmp_path / "own", digits, own, StopCriteria(epochs=1), 100)
    assert [len(r["time"]) for r in records] == [10, 5]
    assert result.stop_reason == "finished 1 epoch"
    follower = Scripted(budgets=[10], decides_stop=False)
    _, records = run_loop(tmp_path / "follower", digits, follower, StopCriteria(epochs=1), 100)
    assert [len(r["time"]) for r in records] == [10, 10]


def test_finish_runs_when_the_algorithm_fails_and_a_negative_budget_is_an_error(tmp_path,
                                                                              digits):
    broken = Scripted(fail_in_round=2)
    with pytest.raises(RuntimeError, match="the algorithm broke"):
        run_loop(tmp_path / "a", digits, broken, StopCriteria(max_rounds=5))
    assert broken.calls[-1] == ("finish",)
    assert len(_records(tmp_path / "a")) == 1
    negative = Scripted(budgets=[-1])
    with pytest.raises(ValueError, match="scripted gave round 1 -1 local iterations"):
        run_loop(tmp_path / "b", digits, negative, StopCriteria(max_rounds=5))
    assert negative.calls[-1] == ("finish",)


def test_a_zero_budget_is_a_round_sat_out(tmp_path, digits):
    """Budget 0 (ESync's --least-speed): the round ends at once, with no iteration and no
    sample, and counts towards the job's rounds; the loop trains again once the
    algorithm gives a budget."""
    algorithm = Scripted(budgets=[1, 0, 0, 2])
    run_loop(tmp_path, digits, algorithm, StopCriteria(max_rounds=5))
    records = _records(tmp_path)
    assert [r["budget"] for r in records] == [1, 0, 0, 2, 2]
    assert [r["num_samples"] for r in records] == [64, 0, 0, 128, 128]
    assert [len(r["time"]) for r in records] == [1, 1, 1, 2, 2]
    assert algorithm.calls[-1] == ("finish",)


def test_the_prepared_loaders_tell_the_session_where_the_data_is(tmp_path):
    """Only the first loader prepared is the training loader; the training data's loader
    says the epochs, runs before each push and adds to each record; passes are counted."""
    algorithm = Scripted(budgets=[2])
    with Session(algorithm, Recorder(str(tmp_path), "host", "dev"), StopCriteria(max_rounds=1),
                 CPU) as session:
        assert session.loader_prepared(32) and not session.loader_prepared(8)
        assert session.loader_batch == 32 and session.epochs_done() == 0.0
        pushed = []
        session.follow_data(lambda: 1.5, before_push=lambda: pushed.append(session.round),
                            round_fields=lambda: {"extra": 7})
        model = build_network("lenet")
        session.adopt(model)
        with session.data_pass():
            assert session.in_pass
            for _ in range(2):
                session.batch_fetched(0.0, 4)
                session.step(lambda: None)
        assert not session.in_pass and session.passes_done == 1
        assert pushed == [1] and session.stop_reason == "finished 1 rounds"
    record = _records(tmp_path)[0]
    assert record["extra"] == 7 and record["epoch"] == 1.5 and record["num_samples"] == 8
