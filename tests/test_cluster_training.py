"""Scheduler, servers and workers as separate processes train lenet on digits (issue 3)."""
import re

import pytest

from tests.cluster import Cluster
from tests.helpers import assert_breakdown

pytestmark = pytest.mark.slow  # whole clusters of real processes

MODES = {"sync": ["-m", "sync"], "async": ["-m", "async"],
         "dcasgd": ["-m", "async", "-dcasgd", "1"]}
LENET_VALUES = 62158 + 452  # weights + BatchNorm running statistics


@pytest.mark.parametrize("servers", [1, 2])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_two_workers_reach_90_percent(tmp_path, mode, servers):
    with Cluster(tmp_path, num_servers=servers, num_workers=2) as job:
        job.start_all([*MODES[mode], "-n", "lenet", "--epochs", "5", "-e", "5"])
        codes = job.wait()
        assert codes == {name: 0 for name in job.procs}, \
            {n: job.output(n)[-600:] for n, c in codes.items() if c != 0}
        evaluator = [w for w in range(2) if "test accuracy 0" in job.output(f"worker{w}")]
        assert len(evaluator) == 1  # rank 0 alone evaluates
        rounds = job.rounds(evaluator[0])
        accuracy = [r["accuracy"] for r in rounds if "accuracy" in r]
        # reached: DC-ASGD's and ASGD's accuracy swings from one evaluation to the next
        # (0.74, 0.66, 0.76, ...), and a last one of 0.894 after a 0.90 failed CI once
        assert max(accuracy) >= 0.90, accuracy
        assert "finished 5 epochs" in job.output(f"worker{evaluator[0]}")
        assert "all 2 workers finished; shutting the servers down" in job.output("scheduler")
        assert "nodes are done" in job.output("scheduler")  # every server confirmed
        # shards balanced by bytes: each server holds its share of weights and buffers
        shards = [tuple(map(int, re.search(r"shard of (\d+) weights and (\d+) buffer",
                                           job.output(f"server{s}")).groups()))
                  for s in range(servers)]
        assert sum(w + b for w, b in shards) == LENET_VALUES
        assert max(w for w, _ in shards) - min(w for w, _ in shards) <= 1
        assert f"rule {mode}" in job.output("server0")
        for w in range(2):
            assert_breakdown(job.rounds(w))
            for record in job.rounds(w)[1:]:
                assert "global aggregate" in record["time"]["0"]
                # one push and one answer of the whole model per round, headers on top
                # (an answer that waited for the other worker's push says how long)
                for key in ("bytes_sent", "bytes_received"):
                    assert 4 * LENET_VALUES < record[key] < 4 * LENET_VALUES + 350 * servers


def test_nodes_started_in_any_order_with_verbose_logs_and_interface(tmp_path):
    """Workers first, then the server, the scheduler last (after more than the heartbeat
    timeout); PS_VERBOSE=1 logs control messages; DMLC_INTERFACE picks the address."""
    import time

    with Cluster(tmp_path, num_servers=1, num_workers=2, heartbeat_timeout=1.5,
                 env={"PS_VERBOSE": "1", "DMLC_INTERFACE": "lo"}) as job:
        for w in range(2):
            job.start(f"worker{w}", "worker", ["-m", "sync", "--max-rounds", "3",
                                               "--device-name", f"w{w}", "-ld", job.log_dir])
        job.start("server0", "server")
        time.sleep(3)
        assert all(p.poll() is None for p in job.procs.values()), "a node gave up waiting"
        job.start("scheduler", "scheduler")
        codes = job.wait()
        assert codes == {name: 0 for name in job.procs}, job.output("scheduler")
        assert "serving at tcp://127.0.0.1:" in job.output("scheduler")
        assert "[scheduler] <- " in job.output("scheduler")  # verbose: control messages
        assert "[ps worker " in job.output("worker0") + job.output("worker1")
        assert "finished 3 rounds" in job.output("worker0") + job.output("worker1")
