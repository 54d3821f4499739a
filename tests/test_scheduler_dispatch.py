"""The scheduler's one dispatch table (esync.transport.scheduler.HANDLERS): a message of
a type it does not take, or a request a sender may not make, is answered with `error`
and changes nothing; the job then ends as usual. And its parts on their own: the roster
(esync.transport.membership), the barriers, the rendezvous and the job's file."""
import json

import msgpack
import pytest
import zmq

from esync.errors import UserError
from esync.transport.barriers import Barriers
from esync.transport.jobfile import JobFile
from esync.transport.membership import Membership, member_from
from esync.transport.message import MessageError, decode
from esync.transport.rendezvous import Rendezvous
from tests.cluster import Cluster


def _ask(sock, header):
    sock.send_multipart([msgpack.packb(header)])
    assert sock.poll(5000), f"the scheduler did not answer {header}"
    return decode(sock.recv_multipart(), ("error", "ack", "member"))


def _dealer(node, name=None):
    """A socket to the scheduler: of `node` (named `name`), or a stranger's."""
    sock = node.context.socket(zmq.DEALER)
    if name is not None:
        sock.setsockopt(zmq.IDENTITY, f"{node.uid}/{name}".encode())
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(node.env.scheduler_address)
    return sock


@pytest.mark.slow  # a real scheduler and server
def test_the_scheduler_answers_what_it_does_not_take_with_an_error(tmp_path):
    with Cluster(tmp_path, num_servers=1, num_workers=1) as job:
        for name in ("scheduler", "server0"):
            job.start(name, name.rstrip("0"))
        with job.node("worker") as node:
            node.register()
            member, stranger = _dealer(node, "raw"), _dealer(node)
            refused = [
                (stranger, {"type": "delete", "sender": "x"}, "unknown message type 'delete'"),
                (stranger, {"type": "barrier", "sender": "x"}, "x is not registered"),
                (stranger, {"type": "finished", "sender": "x"}, "x is not registered"),
                (member, {"type": "delete", "sender": node.uid}, "unknown message type"),
                (member, {"type": "who", "sender": node.uid, "uid": node.uid},
                 "only servers may ask who a peer is"),
                (member, {"type": "stalled", "sender": node.uid, "uid": node.uid},
                 "only servers say that a peer stopped reading"),
                (member, {"type": "rendezvous", "sender": node.uid, "store": "h:1",
                          "evaluator": "e"}, "rendezvous is for jobs without servers"),
                (member, {"type": "register", "sender": node.uid, "role": "worker"},
                 f"{node.uid} is already registered"),
                (member, {"type": "barrier", "sender": node.uid, "group": "servers"},
                 "not a member of group 'servers'"),
                (member, {"type": "lease", "sender": node.uid, "layout": []},
                 "field 'layout' must describe the shards"),
            ]
            for sock, header, problem in refused:
                answer = _ask(sock, header)
                assert answer.type == "error" and problem in answer.header["error"], \
                    (header, answer.header)
            # the member was not made to finish, nor left behind: its heartbeat is answered
            assert _ask(member, {"type": "heartbeat", "sender": node.uid}).type == "ack"
            node.finish()
        assert job.wait(30) == {"scheduler": 0, "server0": 0}, job.output("scheduler")
        assert "dropped a malformed message" in job.output("scheduler")
        assert "aborting" not in job.output("scheduler")


def _register(roster, uid, role="worker", **header):
    member = member_from(uid, {"role": role, "hostname": "h", **header}, 3, uid in roster)
    return member, roster.place(member)


def test_ranks_are_asked_for_then_a_resumed_device_s_then_in_order():
    roster = Membership(0, 3)
    late, _ = _register(roster, "a", device="w-a")
    resumed, _ = _register(roster, "b", device="w-b")
    asking, _ = _register(roster, "c", device="w-c", rank=0)
    assert roster.complete
    waiting = roster.deal_ranks({"w-b@h": 1})
    assert [m.uid for m in waiting] == ["a", "b", "c"] and roster.assigned
    assert (asking.rank, resumed.rank, late.rank) == (0, 1, 2)
    assert roster.worker_devices() == {"w-a@h": 2, "w-b@h": 1, "w-c@h": 0}


def test_a_full_role_is_refused_and_a_new_node_takes_a_dead_one_s_rank():
    roster = Membership(1, 1, {"mode": "sync"})
    _register(roster, "s", "server", host="127.0.0.1", port=9)
    worker, _ = _register(roster, "w", device="w0")
    assert _register(roster, "x")[1] == "the job already has its 1 worker(s) (DMLC_NUM_WORKER)"
    roster.deal_ranks({})
    with pytest.raises(MessageError, match="w is already registered"):
        _register(roster, "w")
    other = member_from("y", {"role": "worker", "settings": {"mode": "async"}}, 1, False)
    assert roster.disagreement(other) == \
        "mode is async for worker (pid 0 on ?) but sync for the scheduler"
    again = member_from("z", {"role": "worker", "hostname": "h", "device": "w0"}, 1, False)
    assert not roster.take_dead_place(again)  # nobody is dead yet
    worker.dead_since = 0.0
    assert roster.take_dead_place(again) and again.rank == 0 and "w" not in roster
    assert roster.servers() == ["tcp://127.0.0.1:9"]


def test_a_barrier_is_released_once_its_living_members_all_came():
    barriers = Barriers()
    living = {"workers": {"a", "b"}}
    assert not barriers.enter("x", "workers", living["workers"])  # not one of them
    assert barriers.enter("a", "workers", living["workers"])
    assert barriers.release(lambda group: living[group]) == []
    living["workers"] = {"a"}  # b died: it is not waited for
    assert barriers.release(lambda group: living[group]) == [("workers", ["a"])]
    assert barriers.started


def test_the_others_hear_where_the_workers_meet_once_worker_0_said_it():
    roster = Membership(0, 2)
    zero, _ = _register(roster, "a")
    one, _ = _register(roster, "b")
    roster.deal_ranks({})
    rendezvous = Rendezvous(0)
    assert not rendezvous.ask(one) and rendezvous.meeting is None
    with pytest.raises(MessageError, match="only worker 0"):
        rendezvous.publish(one, {"store": "h:1", "evaluator": "e"})
    assert rendezvous.publish(zero, {"store": "h:1", "evaluator": "e"}) == ["b"]
    assert rendezvous.ask(one) and rendezvous.meeting == {"store": "h:1", "evaluator": "e"}
    with pytest.raises(MessageError, match="for jobs without servers"):
        Rendezvous(1).ask(one)


def test_the_job_file_keeps_the_id_and_the_ranks_for_a_resumed_job(tmp_path):
    first = JobFile(str(tmp_path), False, 1, 2)
    first.open()
    first.keep_ranks({"w0@h": 1, "w1@h": 0})
    resumed = JobFile(str(tmp_path), True, 1, 2)
    resumed.open()
    assert resumed.job == first.job and resumed.previous_ranks == {"w0@h": 1, "w1@h": 0}
    with open(tmp_path / "job.json") as f:
        assert json.load(f)["num_workers"] == 2
    with pytest.raises(UserError, match="--resume needs --checkpoint-dir"):
        JobFile(None, True, 1, 2).open()
    with pytest.raises(UserError, match="expected"):
        first.name({"ESYNC_JOB_ID": "no spaces allowed"})
