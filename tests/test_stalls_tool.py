"""esync-stalls: the prediction arithmetic (esync.stalls.stallmodel) on hand-computed cases,
and the command run as a user would, on shards the test writes: a table and a
recommendation line per device, exit 0; a bad flag is one line, exit 2."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from esync.stalls import stallmodel as m
from tests.helpers import CLUSTER_VARIABLES, REPO
from tests.test_shard_data import write_shards

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

# per batch of 64: compute 10 ms (12 ms from workers), other 1 ms, decoding 30 ms in the
# training process, 40 ms a DataLoader worker's period, reads 2 ms cached, 10 ms cold
COSTS = m.Costs(batch=64, slowdown=1.0, compute=0.010, compute_shared=0.012, receive=0.0,
                respawn=0.0, other=0.001, prep=0.030, worker=0.040, fetch_cached=0.002,
                fetch_cold=0.010, cores=2)
ALONE = m.Job("none", 1, 0)
NO_LINK = m.Link()


def test_a_batch_takes_its_slowest_stage():
    # K = 0: everything in the training process: 1 + 10 + 30 + 10 ms
    assert m.batch_seconds(COSTS, 0, 0.0) == pytest.approx(0.051)
    assert m.batch_seconds(COSTS, 0, 0.0, cold=False) == pytest.approx(0.043)
    # K = 1: the worker's 40 ms beats the loop's 1 + 12 + 10 and the cores' (55 ms) / 2
    assert m.loop_seconds(COSTS, 1, 0.0) == pytest.approx(0.023)
    assert m.batch_seconds(COSTS, 1, 0.0) == pytest.approx(0.040)
    # K = 2: two workers and the loop share 2 cores, each 1.5 times slower: the
    # workers' 40 x 1.5 / 2 = 30 ms beat the loop's 1 + 12 x 1.5 + 10 and the cores' 27.5
    assert m.sharing(COSTS, 2) == pytest.approx(1.5)
    assert m.cpu_seconds(COSTS, 2, 0.0) == pytest.approx(0.055)
    assert m.loop_seconds(COSTS, 2, 0.0) == pytest.approx(0.029)
    assert m.batch_seconds(COSTS, 2, 0.0) == pytest.approx(0.030)
    assert m.rate(COSTS, 2, 0.0, ALONE, NO_LINK) == pytest.approx(64 / 0.030)
    # slow storage, 50 ms a batch: half the samples cached leave 25 ms of reads
    slow_disk = m.Costs(**{**COSTS.__dict__, "fetch_cold": 0.050})
    assert m.batch_seconds(slow_disk, 2, 0.0) == pytest.approx(0.069)
    assert m.batch_seconds(slow_disk, 2, 0.5) == pytest.approx(0.044)


def test_the_slowdown_scales_the_computing_only():
    slow = m.Costs(**{**COSTS.__dict__, "slowdown": 3.0})
    assert m.batch_seconds(slow, 0, 0.0) == pytest.approx(0.001 + 3 * 0.010 + 0.010 + 0.030)
    # a worker's decoding is not slowed: 1 + 3 x 12 + 10 = 47 ms beats its 40 ms
    assert m.batch_seconds(slow, 1, 0.0) == pytest.approx(0.047)
    # receiving batches and new workers each epoch wait in the loop, unscaled
    waits = m.Costs(**{**slow.__dict__, "receive": 0.002, "respawn": 0.001})
    assert m.batch_seconds(waits, 1, 0.0) == pytest.approx(0.050)
    assert m.batch_seconds(waits, 0, 0.0) == m.batch_seconds(slow, 0, 0.0)
    # its loop is busy a third of the time: two workers and it share 2 cores 7/6 slower
    assert m.sharing(slow, 2) == pytest.approx(7 / 6)
    assert m.batch_seconds(slow, 2, 0.0) == pytest.approx(0.001 + 3 * 0.012 * 7 / 6 + 0.010)


def test_communication_by_backend_and_link():
    link = m.Link(100.0, 5.0)
    mb = 1_000_000
    # parameter servers: push and pull 1 MB at 100 Mbit/s (80 ms each), a round trip
    assert m.communication_seconds(m.Job("ps", 4, mb), link) == pytest.approx(0.17)
    assert m.communication_seconds(m.Job("ps", 4, mb, push_share=0.5), link) == \
        pytest.approx(0.13)
    # a ring of 4: 2 x 3/4 of the bytes each way, 6 steps of latency
    assert m.communication_seconds(m.Job("allreduce", 4, mb), link) == pytest.approx(0.15)
    assert m.communication_seconds(m.Job("ps", 4, mb), m.Link(None, 5.0)) == \
        pytest.approx(0.01)
    assert m.communication_seconds(ALONE, link) == 0.0
    # a round of 2 iterations with 100 ms of it: the loop's 2 x 23 ms come first
    assert m.round_seconds(COSTS, 1, 0.0, steps=2, comm=0.1) == pytest.approx(0.146)


def test_esync_budgets_follow_the_state_servers_rule():
    assert m.budget(0.010, [0.010, 0.040], 16) == 4
    assert m.budget(0.010, [0.010, 0.040], 3) == 3
    assert m.budget(0.010, [0.010, 0.024], 16) == 2
    assert m.budget(0.010, [0.010, 0.025], 16) == 3
    assert m.budget(0.010, [0.010, 0.040], None) == 1
    job = m.Job("ps", 2, 1_000_000, max_local_steps=16)
    assert m.steps(COSTS, 2, 0.0, job, [4 * 0.030]) == 4


def test_shares_are_the_gaps_between_the_runs():
    share = m.shares(0.010, 0.030, 0.040, 0.010)
    assert share == pytest.approx({"compute": 0.2, "prep": 0.4, "fetch": 0.2,
                                   "communication": 0.2})
    # a cold run faster than the cached one is noise: no negative fetch stall
    assert m.shares(0.010, 0.030, 0.025, 0.0)["fetch"] == 0.0
    # a cache of half the samples: half the cold run's extra 10 ms
    assert m.shares(0.010, 0.030, 0.040, 0.0, cache=0.5) == pytest.approx(
        {"compute": 0.010 / 0.035, "prep": 0.020 / 0.035, "fetch": 0.005 / 0.035,
         "communication": 0.0})


def test_recommendations_name_the_remedy():
    prep = m.shares(0.011, 0.041, 0.041, 0.0)
    line = m.recommend("w3", prep, COSTS, 1, 0.0, ALONE, NO_LINK)
    assert line == ("device w3: 73% prep-stalled; 1 more DataLoader worker "
                    "(--loader-workers 2) would remove it")
    # 50 ms of reads: the loop's 19 + 50 (1 - x) ms within 3% of the workers' 30: x = 0.8
    slow_disk = m.Costs(**{**COSTS.__dict__, "fetch_cold": 0.050})
    fetch = m.shares(0.011, 0.0275, 0.063, 0.0)
    assert m.recommend("w1", fetch, slow_disk, 2, 0.0, ALONE, NO_LINK) == (
        "device w1: 56% fetch-stalled; a memory cache of 80% of its samples "
        "(--cache-fraction 0.8) would remove it")
    busy = m.shares(0.050, 0.051, 0.052, 0.0)
    assert m.recommend("w0", busy, COSTS, 0, 0.0, ALONE, NO_LINK) == \
        "device w0: compute-bound (96% computing): a faster accelerator is what helps"
    # 2 MB a round at 10 Mbit/s: 5% of a 51 ms round needs 16e6 bits in 2.68 ms
    job, link = m.Job("ps", 2, 1_000_000), m.Link(10.0, 0.0)
    comm = m.shares(0.011, 0.043, 0.051, m.communication_seconds(job, link))
    assert m.recommend("w2", comm, COSTS, 0, 0.0, job, link) == \
        "device w2: 97% communication-stalled; a link of 5,961 Mbit/s would cut it to 5%"
    # 2 x 50 ms of latency a round against its 51 ms: no bandwidth helps much
    far = m.Link(1000.0, 50.0)
    comm = m.shares(0.011, 0.043, 0.051, m.communication_seconds(job, far))
    assert m.recommend("w4", comm, COSTS, 0, 0.0, job, far) == (
        "device w4: 69% communication-stalled, mostly by its link's latency (100 ms a "
        "round; a faster link would leave 66%): fewer, longer rounds would help")


def test_what_ifs_cover_workers_caches_and_links():
    job, link = m.Job("ps", 2, 1_000_000), m.Link(100.0, 0.0)
    out = m.what_ifs(COSTS, 1, 0.0, job, link, [], [0.0, 0.5], [10.0, None])
    assert [w["workers"] for w in out["loader_workers"]] == [0, 1, 2]
    comm = m.communication_seconds(job, link)
    assert out["loader_workers"][2]["rate"] == pytest.approx(64 / (0.029 + comm))
    assert [w["fraction"] for w in out["cache_fraction"]] == [0.0, 0.5]
    assert out["link"][1]["rate"] == pytest.approx(64 / 0.040)  # unpaced: K=1's 40 ms
    assert m.what_ifs(COSTS, 1, 0.0, ALONE, link, [], [0.0], [10.0])["link"] == []
    in_memory = m.what_ifs(m.Costs(**{**COSTS.__dict__, "loader": False}), 0, 0.0, ALONE,
                           link, [], [0.0, 0.5], [10.0])
    assert len(in_memory["loader_workers"]) == 1 and in_memory["cache_fraction"] == []


# --- the command ---------------------------------------------------------------------
def command():
    return shutil.which("esync-stalls") or os.path.join(os.path.dirname(sys.executable),
                                                        "esync-stalls")


def run(*args, timeout=120):
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARIABLES}
    return subprocess.run([command(), *args], capture_output=True, text=True, cwd=REPO,
                          env=dict(env, OMP_NUM_THREADS="1"), timeout=timeout)


@pytest.mark.slow  # trains each device in short runs (about 20 s)
def test_a_job_of_two_devices_gets_a_table_and_a_recommendation_each(tmp_path):
    shards = write_shards(tmp_path / "shards", n_train=600)
    report = tmp_path / "stalls.json"
    done = run("-m", "sync", "--workers", "2", "--slowdown", "1,3", "--bandwidth", "none,50",
               "-n", "lenet", "--dataset", f"shards:{shards}", "-b", "16",
               "--loader-workers", "1", "--seconds", "1.5", "--json", str(report))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "Traceback" not in done.stderr
    for label in ("w0", "w1-x3"):
        assert f"device {label} (--slowdown" in out
        lines = [line for line in out.splitlines() if line.startswith(f"device {label}: ")]
        assert len(lines) == 1, out
        assert any(word in lines[0] for word in ("stalled", "compute-bound")), lines[0]
    for heading in ("synthetic", "cached", "cold", "what-if --loader-workers",
                    "what-if --cache-fraction", "what-if link Mbit/s"):
        assert out.count(heading) >= 2, (heading, out)
    data = json.loads(report.read_text())
    assert [d["label"] for d in data["devices"]] == ["w0", "w1-x3"]
    for d in data["devices"]:
        assert all(d["rates"][k] > 0 for k in ("synthetic", "cached", "cold"))
        assert "cached, --loader-workers 0" in d["runs"] and "cold, --loader-workers 1" in d["runs"]
        assert sum(d["shares"].values()) == pytest.approx(1.0)
        assert d["eviction"]  # which eviction took effect, or that none did
        assert len(d["predicted"]["loader_workers"]) == data["job"]["cores"] + 1
    assert [d["slowdown"] for d in data["devices"]] == [1.0, 3.0]
    assert data["devices"][0]["eviction"].startswith(("evicted by", "not evicted"))
    # the slow device's 50 Mbit/s link costs it communication; the unpaced one's nothing
    assert data["devices"][1]["communication_seconds"] > 0
    assert data["devices"][0]["communication_seconds"] == 0


@pytest.mark.parametrize("args, says", [
    (["-m", "sync", "--bogus", "1"], "unrecognized arguments: --bogus"),
    (["-m", "sync", "--workers", "x"], "argument --workers: invalid int value"),
    (["-m", "sync", "--workers", "2", "--slowdown", "1,2,3"], "--slowdown '1,2,3'"),
    (["-m", "sync", "-b", "0"], "-b/--batch-size"),
    (["-n", "lenet"], "-m/--mode"),
    (["-m", "local", "--dataset", "shards:/no/such/folder"], "/no/such/folder"),
    (["-m", "local", "--seconds", "-1"], "--seconds"),
    (["-m", "local", "--links", "10,x"], "--links"),
    (["-m", "sync", "no_such_script.py", "--its-flag"], "no_such_script.py: no such training"),
])
def test_a_bad_flag_is_one_line_and_exit_status_2(args, says):
    done = run(*args, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("esync-stalls: error: ")
    assert says in done.stderr, done.stderr
    assert done.stdout == ""


# --- a training script of the user's ------------------------------------------------
TINY_SCRIPT = '''"""A tiny training script on esync's API (tests/test_stalls_tool.py)."""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import esync

esync.init()
with open(sys.argv[sys.argv.index("--mark") + 1] + f".{esync.get_session().rank}", "w") as f:
    f.write(" ".join(sys.argv[1:]))
torch.manual_seed(0)
x = torch.randn(256, 8)
y = (x[:, 0] > 0).long()
model = esync.prepare_model(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                                torch.nn.Linear(8, 2)))
loader = esync.prepare_data_loader(DataLoader(TensorDataset(x, y), batch_size=16,
                                              shuffle=True))
opt = esync.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
while not esync.should_stop():
    for inputs, targets in loader:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        esync.report(loss.item())
        loss.backward()
        opt.step()
'''


def test_a_script_is_split_off_as_esync_run_does(tmp_path):
    from esync.launch import stalls

    script = tmp_path / "train.py"
    script.write_text(TINY_SCRIPT)
    args, plan, _, given, rest = stalls._plan(
        ["--seconds", "2", "-m", "sync", "--workers", "2", str(script), "--mark", "x",
         "--seconds", "9"])
    assert args.seconds == 2  # the script's own --seconds is its own
    assert plan.script == [str(script), "--mark", "x", "--seconds", "9"]
    assert rest == ["-m", "sync", "--workers", "2"]
    assert stalls.built_in_note(plan, given) is None


def test_without_a_script_or_a_network_it_says_what_it_measures():
    from esync.launch import stalls

    _, plan, _, given, _ = stalls._plan(["-m", "local"])
    note = stalls.built_in_note(plan, given)
    assert note.startswith("esync-stalls: no script and no -n: measuring the built-in "
                           f"network {plan.options.network} ")
    assert f"--dataset {plan.options.dataset}" in note and "\n" not in note
    _, plan, _, given, _ = stalls._plan(["-m", "local", "-n", "lenet"])
    assert stalls.built_in_note(plan, given) is None


def test_script_recommendations_name_the_largest_stall():
    from esync.launch.stalls import script_recommendation

    shares = {"fetch": 0.0, "prep": 0.5, "communication": 0.1, "wait": 0.05,
              "state_server": 0.0, "compute": 0.3, "other": 0.05}
    assert script_recommendation("w1", shares).startswith(
        "device w1: 50% prep-stalled (decoding, its transform and collation): more worker "
        "processes in the script's DataLoader")
    busy = dict(shares, prep=0.05, communication=0.05, compute=0.8)
    assert script_recommendation("w0", busy) == (
        "device w0: compute-bound (80% computing): a faster accelerator is what helps")


@pytest.mark.slow  # runs the script's job, 2 workers (about 15 s)
def test_a_script_is_measured_in_one_run_of_its_job(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text(TINY_SCRIPT)
    report = tmp_path / "stalls.json"
    mark = tmp_path / "argv"
    done = run("--seconds", "2", "--json", str(report), "-m", "sync", "--workers", "2",
               "--slowdown", "1,2", "--num-threads", "1", str(script), "--mark", str(mark),
               timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    out = done.stdout
    # the script ran as each worker, with its own flags, not the built-in lenet
    for rank in (0, 1):
        assert (tmp_path / f"argv.{rank}").read_text() == f"--mark {mark}"
    assert "lenet" not in out + done.stderr
    assert [line for line in out.splitlines() if "none is predicted for a script" in line] \
        == [f"tiny.py: measured in one run of its job as esync-run starts it (2 s of "
            f"training); the what-ifs (--loader-workers, --cache-fraction, link "
            f"bandwidths) need the built-in loop's runs alone, on its own data and "
            f"DataLoader, so none is predicted for a script"]
    for label in ("w0", "w1-x2"):
        assert any(line.startswith(f"{label} ") for line in out.splitlines()), out
        lines = [line for line in out.splitlines() if line.startswith(f"device {label}: ")]
        assert len(lines) == 1, out
    data = json.loads(report.read_text())
    assert [d["label"] for d in data["devices"]] == ["w0", "w1-x2"]
    for d in data["devices"]:
        assert d["rounds"] > 0 and d["run"]["rate"] > 0
        assert sum(d["shares"].values()) == pytest.approx(1.0)
    assert data["job"]["script"] == [str(script), "--mark", str(mark)]
