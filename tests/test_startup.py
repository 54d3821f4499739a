"""esync.runtime.startup: the one start-up sequence of main.py / `esync` and of esync.init, run in
this process for each role (nothing is joined: start only parses, reads the variables,
checks and says what the job's nodes must agree on)."""
import subprocess
import sys

import pytest

from esync.errors import UserError
from esync.runtime.startup import start
from tests.helpers import CLUSTER_VARIABLES

CLUSTER = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9", "DMLC_NUM_SERVER": "1",
           "DMLC_NUM_WORKER": "2"}
DDP = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "5"}


@pytest.fixture
def environ(monkeypatch):
    """Set exactly these job variables (the others unset)."""
    for var in CLUSTER_VARIABLES:
        monkeypatch.delenv(var, raising=False)

    def set_(variables):
        for var, value in variables.items():
            monkeypatch.setenv(var, value)
    return set_


def test_alone_a_worker_is_checked_and_agrees_with_nobody(environ, tmp_path):
    environ({})
    begun = start(["--max-rounds", "1", "-ld", str(tmp_path)], "esync")
    assert (begun.role, begun.env, begun.settings, begun.device) == ("worker", None, None, None)
    assert begun.plan.algorithm.mode == "local" and begun.plan.device.type == "cpu"
    assert begun.given == {"max_rounds", "log_dir"} and not begun.ddp


def test_a_cluster_node_says_what_the_job_must_agree_on(environ):
    environ({**CLUSTER, "DMLC_ROLE": "worker"})
    worker = start(["-m", "sync", "--max-rounds", "3"], "esync")
    assert worker.role == "worker" and worker.plan.algorithm.mode == "sync"
    assert worker.settings["DMLC_NUM_WORKER"] == "2" and worker.settings["-m"] == "sync"
    environ({"DMLC_ROLE": "server"})
    server = start(["-m", "sync"], "esync")
    assert (server.role, server.plan, server.device) == ("server", None, None)
    assert server.settings["DMLC_NUM_SERVER"] == "1"
    environ({"DMLC_ROLE": "evaluator"})
    evaluator = start(["-m", "sync"], "esync")
    assert evaluator.plan is None and evaluator.device.type == "cpu"


def test_a_ddp_rank_and_its_evaluator(environ):
    environ(DDP)
    rank = start(["-m", "ddp"], "esync")
    assert rank.ddp and rank.role == "worker" and rank.env.world_size == 2
    assert rank.settings is None and rank.plan.algorithm.mode == "ddp"
    environ({"DMLC_ROLE": "evaluator"})
    assert start(["-m", "ddp"], "esync").device.type == "cpu"


@pytest.mark.parametrize("variables, args, message", [
    ({**CLUSTER, "DMLC_ROLE": "server"}, ["-m", "sync"],
     "DMLC_ROLE=server: a training script is a worker"),
    ({**DDP, "DMLC_ROLE": "evaluator"}, ["-m", "ddp"],
     "DMLC_ROLE=evaluator: a training script is a worker"),
    ({**DDP, "DMLC_ROLE": "worker"}, ["-m", "ddp"],
     "DMLC_ROLE=worker: -m ddp runs with torch.distributed's variables"),
], ids=["server", "ddp-evaluator", "ddp-worker-role"])
def test_a_script_is_a_worker_only(environ, variables, args, message):
    environ(variables)
    with pytest.raises(UserError, match=message):
        start(args, "script.py", script=True)


def test_a_scheduler_starts_without_torch():
    """A scheduler (and a bad flag) is refused or started before torch is imported."""
    code = ("import sys; from esync.runtime.startup import start; "
            "begun = start(['-m', 'esync'], 'esync'); "
            "print(begun.role, 'torch' in sys.modules)")
    env = {"DMLC_ROLE": "scheduler", **CLUSTER, "PATH": ""}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**env, "PYTHONPATH": ":".join(sys.path)}, check=True)
    assert result.stdout.split() == ["scheduler", "False"]


@pytest.mark.parametrize("variables, args, message", [
    (DDP, ["-m", "ddp", "--data-split", "whole"], "-m ddp trains its ranks in lockstep"),
    (CLUSTER, ["-m", "esync", "-s", "1", "--data-split", "whole"],
     "-s 1 keeps each worker's classes"),
    (CLUSTER, ["-m", "esync", "--dataset", "shards:/nowhere", "--data-split", "whole"],
     "--data-split whole is for map-style data sets"),
], ids=["ddp", "by-class", "shards"])
def test_data_split_whole_is_refused_where_it_cannot_apply(environ, variables, args, message):
    environ({**variables, "DMLC_ROLE": "worker"} if variables is CLUSTER else variables)
    with pytest.raises(UserError, match=message):
        start(args, "esync")
