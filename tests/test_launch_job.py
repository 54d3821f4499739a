"""esync/launch/job.py: a job's roles, built once for every launcher (processes here, Ray
actors, printed host commands), and their endpoints filled by each backend."""
from __future__ import annotations

import os

from esync.launch import local
from esync.launch.job import (ADDRESS, REPO, Role, address_of, cluster_variables, launch,
                              port_of, roles)


class Table:
    """A backend that places every role at a fixed address and port, as a host file does,
    and keeps the roles it was given."""

    def __init__(self):
        self.started = []

    def endpoint(self, name):
        return f"{name}.host", {"scheduler": "9091", "stateserver": "10010"}.get(name, "29500")

    def start(self, role):
        self.started.append(role.resolved(self.endpoint))


def test_a_parameter_server_job_s_roles_in_order_with_their_variables():
    job = roles("ps", 2, 3, evaluator=True, state_flags=True)
    assert [r.name for r in job] == ["stateserver", "scheduler", "evaluator", "server0",
                                     "server1", "worker0", "worker1", "worker2"]
    assert [r.name for r in job if r.listens] == ["stateserver", "scheduler"]
    backend = Table()
    launch(job, backend)
    worker = backend.started[-1]
    assert worker.env == {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "scheduler.host",
                          "DMLC_PS_ROOT_PORT": "9091", "DMLC_NUM_SERVER": "2",
                          "DMLC_NUM_WORKER": "3", "DMLC_WORKER_ID": "2"}
    assert list(worker.env) == list(cluster_variables("worker", 2, 3, 2))  # the printed order
    assert worker.flags == ("-ip", "stateserver.host", "-port", "10010")
    assert backend.started[1].env["DMLC_ROLE"] == "scheduler" and backend.started[3].index == 0
    assert all(r.flags == () for r in backend.started if r.kind != "worker")


def test_ddp_ranks_reach_rank_0_and_a_job_alone_has_one_worker():
    job = roles("ddp", 0, 3, evaluator=True, state_server=False)
    assert [r.name for r in job] == ["worker0", "worker1", "worker2", "evaluator"]
    assert job[0].listens and not any(r.listens for r in job[1:])
    assert job[2].env == {"WORLD_SIZE": "3", "MASTER_ADDR": address_of("worker0"),
                          "MASTER_PORT": port_of("worker0"), "RANK": "2"}
    assert job[3].env["DMLC_ROLE"] == "evaluator" and "RANK" not in job[3].env
    assert [r.name for r in roles("alone", 0, 1)] == ["stateserver", "worker0"]
    assert roles("alone", 0, 1)[1].env == {}


def test_a_role_that_binds_before_it_runs_and_placeholders_left_alone():
    """A role's own endpoint, before it starts, is where it binds (here: ADDRESS:0);
    other placeholders (the Python, the checkout) are the place's to fill later."""
    scheduler = Role("scheduler", "scheduler", env=cluster_variables("scheduler", 1, 1))
    bound = scheduler.resolved(lambda name: (ADDRESS, "0"))
    assert bound.env["DMLC_PS_ROOT_URI"] == ADDRESS and bound.env["DMLC_PS_ROOT_PORT"] == "0"


def test_the_local_plan_s_roles_and_commands(tmp_path):
    plan = local.plan(["-m", "esync", "--workers", "2", "--slowdown", "1,3",
                       "--out", str(tmp_path)])
    job = plan.roles()
    assert [r.name for r in job] == ["stateserver", "scheduler", "evaluator", "server0",
                                     "worker0", "worker1"]
    argv, env, log = plan.command(job[-1].resolved(Table().endpoint))
    assert log == "w1-x3/worker.log" and env == {}
    assert argv[argv.index("-ip") + 1] == "stateserver.host"
    assert argv[argv.index("--slowdown") + 1] == "3" and argv[argv.index("-m") + 1] == "esync"
    assert plan.command(job[0])[2] == "stateserver.log"
    ddp = local.plan(["-m", "ddp", "--workers", "2", "--out", str(tmp_path)]).roles()
    assert [r.name for r in ddp] == ["stateserver", "worker0", "worker1", "evaluator"]


def test_the_checkout_is_the_folder_of_main_py():
    assert os.path.isfile(os.path.join(REPO, "main.py"))
    assert os.path.isdir(os.path.join(REPO, "stateserver"))
