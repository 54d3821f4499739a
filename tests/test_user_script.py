"""A researcher's own script (tests/researcher_plain.py: dict batches, BatchNorm and
LayerNorm in a model over 64 KB, AdamW with two parameter groups, OneCycleLR stepped
every step, clipping, bf16 autocast, validation and saving on rank 0), converted by the
tutorial alone (tests/researcher_script.py), run by esync-run as its user would, in
every mode: to the end of its epoch loop under a time limit, and for exactly
--max-rounds rounds; with its other loop shapes; with a worker that raises; resumed
from a checkpoint against an uninterrupted run; with files beside it named as esync's
modules once were."""
import difflib
import json
import os
import re
import signal
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from tests.helpers import REPO, assert_no_traceback

PLAIN = os.path.join(REPO, "tests", "researcher_plain.py")
SCRIPT = os.path.join(REPO, "tests", "researcher_script.py")
TUTORIAL = os.path.join(REPO, "docs", "tutorials", "your-own-script.md")
MODES = {"esync": ["-m", "esync"], "sync": ["-m", "sync"], "async": ["-m", "async"],
         "dcasgd": ["-m", "async", "-dcasgd", "1"], "ddp": ["-m", "ddp"],
         "ddp-balanced": ["-m", "ddp", "--balance-batches", "1"],
         "sync-allreduce": ["-m", "sync", "--backend", "allreduce"], "local": ["-m", "local"]}
FOLDERS = {"sync-allreduce": "sync"}
#: two fast devices and a slow one, where the mode has several
HETEROGENEOUS = ["--workers", "3", "--slowdown", "1,1,3"]
#: ESync with every device training: at 1,1,3 on 2 crowded cores the slow device can
#: measure itself below the default least speed (a fifth of the fastest) and sit the job
#: out, which a test of the schedule on every device does not ask about (a device that
#: sat out ends fewer passes of its own: its once-an-epoch schedule lags the job's)
EVERY_DEVICE_TRAINS = ["--least-speed", "0"]


def esync_run(tmp_path, flags, script_args=(), script=SCRIPT, timeout=240, cwd=None,
              expect=0):
    """esync-run as its user types it; (the process, {rank: what the script saw})."""
    seen = tmp_path / "seen"
    seen.mkdir(exist_ok=True)
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "esync-run"), "--out",
         str(tmp_path / "runs"), "--no-progress", "--num-threads", "1", *flags, str(script),
         str(seen), *script_args],
        cwd=cwd or tmp_path, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = {int(re.search(r"seen-(\d+)", f).group(1)): json.load(open(seen / f))
             for f in os.listdir(seen) if f.startswith("seen-")}
    return proc, found


def job_folder(tmp_path, mode, name="researcher_script"):
    """OUT/<script>/<the mode's log folder>."""
    return tmp_path / "runs" / name / FOLDERS.get(mode, mode)


def records(folder):
    """{device label: [its round records, in order]} of a job's folder."""
    (host,) = [h for h in folder.iterdir() if h.is_dir()]
    out = {}
    for device in host.iterdir():
        if device.is_dir() and device.name != "evaluator":
            files = sorted(device.glob("iter-*.json"), key=lambda p: int(p.stem[5:]))
            out[device.name] = [json.load(open(f)) for f in files]
    return out


def logs(folder):
    (host,) = [h for h in folder.iterdir() if h.is_dir()]
    return {str(p.relative_to(host)): p.read_text() for p in host.rglob("*.log")}


def script_model():
    """A new model of the script's class (its MLP)."""
    sys.path.insert(0, os.path.dirname(PLAIN))
    try:
        from researcher_plain import MLP
    finally:
        sys.path.remove(os.path.dirname(PLAIN))
    return MLP()


def final_model(folder):
    """The job's model.safetensors, loaded into the script's model."""
    from safetensors.torch import load_file

    model = script_model()
    (path,) = folder.glob("*/*/model.safetensors")  # rank 0's folder: w0, or alone
    assert path.parent.name in ("w0", "cpu"), path
    model.load_state_dict(load_file(str(path)))
    return model


# --- the conversion ----------------------------------------------------------------------

def tutorial_idioms():
    """The esync calls of the tutorial's conversion (its lines marked `# esync`), and the
    loop conditions its Loops section gives."""
    page = open(TUTORIAL).read()
    marked = [line.split("#")[0] for line in page.splitlines() if "# esync" in line]
    calls = set(re.findall(r"esync\.[A-Za-z_]+\((?:\)|metric=)?", "\n".join(marked)))
    calls.add("import esync")
    loops = re.findall(r"`(while [^`]*esync\.should_stop\(\)[^`]*)`"
                       r"|end on `(esync\.should_stop\(\))`", page)
    return calls, bool(loops)


def test_the_conversion_adds_only_the_tutorial_s_lines():
    calls, loops_documented = tutorial_idioms()
    assert {"esync.init()", "esync.get_device()", "esync.prepare_model(",
            "esync.prepare_data_loader(", "esync.DistributedOptimizer(",
            "esync.prepare_scheduler(", "esync.report(", "esync.get_session()"} <= calls, calls
    assert loops_documented
    plain = open(PLAIN).read().split('"""', 2)[2].splitlines()
    converted = open(SCRIPT).read().split('"""', 2)[2].splitlines()
    added = [line for line in difflib.unified_diff(plain, converted, lineterm="", n=0)
             if line.startswith("+") and not line.startswith("+++")]
    assert 10 <= len(added) <= 16, added
    for line in added:
        assert any(call in line for call in calls) or "esync.should_stop()" in line \
            or line.strip() == "+" or line.lstrip("+ ").startswith("{"), line


# --- every mode ---------------------------------------------------------------------------

def _check_job(tmp_path, mode, seen, rounds=None):
    folder = job_folder(tmp_path, mode)
    every = records(folder)
    workers = 1 if mode == "local" else 3
    assert sorted(seen) == list(range(workers))
    assert_no_traceback(logs(folder))
    for rank, saw in seen.items():
        # the prepared scheduler never steps a OneCycleLR past its end (which raises)
        assert saw["last_epoch"] <= saw["total_steps"]
        if rounds is not None:  # exactly --max-rounds: as many rounds, as many steps
            assert saw["last_epoch"] == rounds, (rank, saw)
        else:  # the epoch loop ran to its end: the schedule is done on every device
            assert saw["last_epoch"] == saw["total_steps"], (rank, saw)
    for device, done in every.items():
        if rounds is not None:
            assert len(done) == rounds, (device, len(done))
    # worker 0 is rank 0 (it validates: its records carry the metric it reported)
    first = "w0" if mode != "local" else next(iter(every))
    assert any("accuracy" in r for r in every[first]), [sorted(r) for r in every[first]]
    if mode == "ddp-balanced":  # the loaders' batches, shared by speed: 3 x 32 a step
        assert all(sum(r["batch_sizes"]) == 96 for done in every.values() for r in done)
    # the job's final model, a state_dict in safetensors, as good as rank 0's last look
    model = final_model(folder)
    assert sum(p.numel() * 4 for p in model.parameters()) > 64 * 1024
    assert (tmp_path / "seen" / "best.pt").exists()


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_the_epoch_loop_runs_to_its_end_under_a_time_limit(tmp_path, mode):
    """The loop ends by itself, whichever worker's first: exit 0 long before the limit,
    the schedule done on every device, the job's model written."""
    flags = [*MODES[mode], *([] if mode == "local" else HETEROGENEOUS), "--time-limit", "120",
             *(EVERY_DEVICE_TRAINS if mode == "esync" else [])]
    started = time.monotonic()
    proc, seen = esync_run(tmp_path, flags, ["--epochs", "2", "--val-every", "3"])
    assert time.monotonic() - started < 90, proc.stdout
    _check_job(tmp_path, mode, seen)


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_max_rounds_means_exactly_that_many_rounds_and_scheduler_steps(tmp_path, mode):
    flags = [*MODES[mode], *([] if mode == "local" else HETEROGENEOUS), "--max-rounds", "5"]
    _, seen = esync_run(tmp_path, flags, ["--epochs", "50", "--val-every", "2"])
    _check_job(tmp_path, mode, seen, rounds=5)


@pytest.mark.slow
def test_max_rounds_reached_while_a_device_sits_rounds_out(tmp_path):
    """ESync with the slow device at 1/30 sitting rounds out (it measures in rounds 1 and
    5): the job stops after round 4 while it sits out, at a round that most often ends
    its loader's pass too (a round trains about an epoch). Its scheduler still comes to
    round 4 (it was left at round 1: the loader ended the pass on the batch in hand
    rather than yield it, so the script's scheduler.step() never ran again)."""
    flags = ["-m", "esync", "--workers", "3", "--slowdown", "1,1,30", "--max-rounds", "4"]
    _, seen = esync_run(tmp_path, flags, ["--epochs", "50", "--val-every", "2"])
    _check_job(tmp_path, "esync", seen, rounds=4)


@pytest.mark.slow
@pytest.mark.parametrize("least_speed", ["0.2", "0"])
def test_esync_s_first_round_measures_speeds_and_moves_nothing(tmp_path, least_speed):
    """Round 1 (nobody has measured its speed) measures: each device runs one iteration
    and, with a least speed (the default's 0.2), its delta weighs nothing, so the job's
    weights after it are the script's initial ones (each device keeps its step, for
    round 2's delta: a job of one round ends with the job's model, not its own); with
    least speed 0 (the paper's rule) round 1 is SSGD's step and moves them."""
    flags = ["-m", "esync", "--workers", "2", "--slowdown", "1,8", "--max-rounds", "1",
             "--least-speed", least_speed]
    _, seen = esync_run(tmp_path, flags, ["--epochs", "50"])
    # the measuring iteration was timed and its optimizer step taken (AdamW's state
    # holds one step), in both rules
    assert {rank: s["optimizer_steps"] for rank, s in seen.items()} == {0: 1, 1: 1}
    folder = job_folder(tmp_path, "esync")
    every = records(folder)
    assert {len(done) for done in every.values()} == {1}
    assert {done[0].get("measuring", False) for done in every.values()} == \
        {least_speed != "0"}
    torch.manual_seed(0)  # as the script does before building its model
    start = dict(script_model().named_parameters())  # (BatchNorm's statistics move)
    moved = max((p - start[k]).abs().max().item()
                for k, p in final_model(folder).named_parameters())
    assert (moved == 0.0) == (least_speed != "0"), moved


@pytest.mark.slow
@pytest.mark.parametrize("loop, flags", [
    ("steps", ["--time-limit", "3"]),        # its own step count, cut by the job's limit
    ("forever", ["--max-rounds", "6"]),      # while not esync.should_stop()
    ("epochs", ["--time-limit", "3"]),       # epochs it never reaches
], ids=["steps-time-limit", "forever-max-rounds", "epochs-time-limit"])
def test_other_loop_shapes_end_with_the_job(tmp_path, loop, flags):
    proc, seen = esync_run(tmp_path, ["-m", "esync", *HETEROGENEOUS, *flags],
                           ["--loop", loop, "--steps", "100000", "--epochs", "100000",
                            "--val-every", "3"])
    assert sorted(seen) == [0, 1, 2]
    every = records(job_folder(tmp_path, "esync"))
    if "--max-rounds" in flags:
        assert {len(done) for done in every.values()} == {6}
    else:  # ended by the job's time limit, not by its own (unreachable) count
        assert max(r["total_time"] for done in every.values() for r in done) >= 3
        said = "".join(logs(job_folder(tmp_path, "esync")).values())
        assert "reached the time limit of 3 s" in said
    # the metric rank 0 reported is the job's: on the progress line, and drawn
    assert re.search(r"done: .*test accuracy 0\.\d+", proc.stderr), proc.stderr[-500:]
    base = tmp_path / "runs"
    for tool, argv in (("esync-summary", ["-b", str(base), "-n", "researcher_script",
                                          "-m", "esync"]),
                       ("esync-draw", ["-b", str(base), "-n", "researcher_script",
                                       "-o", str(tmp_path / "figures")])):
        done = subprocess.run([os.path.join(os.path.dirname(sys.executable), tool), *argv],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "no data" not in done.stdout + done.stderr, done


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["esync", "async"])
def test_a_schedule_stepped_once_an_epoch_follows_the_job_s_epochs(tmp_path, mode):
    """CosineAnnealingLR(T_max=epochs), stepped after each pass: once an epoch of the
    job's on every device, fast or slow, whatever the steps each took."""
    _, seen = esync_run(tmp_path, ["-m", mode, *HETEROGENEOUS, "--time-limit", "120",
                                   *(EVERY_DEVICE_TRAINS if mode == "esync" else [])],
                        ["--epochs", "3", "--schedule", "epoch"])
    assert {saw["last_epoch"] for saw in seen.values()} == {3}
    assert len({saw["steps"] for saw in seen.values()}) > 1  # the devices' steps differ


# --- failures ----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("mode, at", [("esync", 4), ("ddp", 4), ("ddp", 0)],
                         ids=["esync", "ddp", "ddp-at-start"])
def test_an_exception_in_a_worker_ends_the_job_with_its_line(tmp_path, mode, at):
    """A bug is not a lost machine: exit status 1, the error and the script's line in the
    launcher's last words, within seconds, nothing left behind (a DDP rank that fails
    before its first step too: the others are then in their first collective)."""
    started = time.monotonic()
    proc, _ = esync_run(tmp_path, [*MODES[mode], *HETEROGENEOUS, "--time-limit", "120"],
                        ["--epochs", "1000", "--raise-at", str(at), "--raise-rank", "1"],
                        expect=1)
    assert time.monotonic() - started < 60
    said = "a bug at start" if at == 0 else f"a bug at step {at}"
    last = proc.stderr.strip().splitlines()[-1]
    assert "launch: error:" in last and f"ValueError: {said}" in last, proc.stderr
    if mode != "ddp":
        assert "worker 1 failed" in last and "researcher_script.py, line" in last, last
    worker_log = logs(job_folder(tmp_path, mode))["w1/worker.log"]
    assert "Traceback" in worker_log and said in worker_log


@pytest.mark.slow
@pytest.mark.parametrize("mode, leaver", [("ddp", 1), ("ddp", 0), ("ddp-balanced", 2),
                                          ("esync", 1)])
def test_a_worker_whose_loop_ends_first_ends_the_job_cleanly(tmp_path, mode, leaver):
    """One worker's own loop ends after its step 5 (its own count, as a clock of its own
    would), the others' go on: every one stops right after, exit 0 (under DDP the one
    that left takes the others' next step with them, untrained, rather than leave them
    waiting in a collective)."""
    proc, seen = esync_run(tmp_path, [*MODES[mode], *HETEROGENEOUS, "--time-limit", "120"],
                           ["--epochs", "1000", "--leave-at", "5", "--leave-rank",
                            str(leaver)])
    assert seen[leaver]["steps"] == 5
    every = records(job_folder(tmp_path, mode))
    assert max(len(done) for done in every.values()) <= 7, \
        {device: len(done) for device, done in every.items()}
    assert_no_traceback(logs(job_folder(tmp_path, mode)))


@pytest.mark.slow
def test_a_gpu_worker_on_a_machine_without_one_is_one_line(tmp_path):
    """--devices gpu where there is no GPU: the worker says so, and the job ends, non-zero,
    rather than going on without it."""
    proc, _ = esync_run(tmp_path, ["-m", "esync", "--workers", "2", "--devices", "gpu,cpu",
                                   "--time-limit", "60"], ["--epochs", "1"], expect=1)
    assert "-g/--gpu 0: this machine has no CUDA device" in proc.stderr.strip().splitlines()[-1]


def kill_mid_job(tmp_path, flags, device):
    """esync-run in the background; once `device` has logged round 3, SIGKILL its script
    (the pid in its log folder's lock, esync.logs.recorder). (its pid, seconds from the kill
    to the job's end, the finished process, its stdout and stderr)."""
    seen = tmp_path / "seen"
    seen.mkdir()
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "esync-run"), "--out",
         str(tmp_path / "runs"), "--no-progress", "--num-threads", "1", *flags, SCRIPT,
         str(seen), "--epochs", "1000"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        runs = tmp_path / "runs" / "researcher_script"
        deadline = time.monotonic() + 120
        while not list(runs.glob(f"*/*/{device}/iter-3.json")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        victim = int(next(runs.glob(f"*/*/{device}/.lock")).read_text().strip())
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        out, err = proc.communicate(timeout=120)
        return victim, time.monotonic() - killed, proc, out, err
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_a_worker_killed_is_survived_and_named_at_the_end(tmp_path):
    """A lost machine (SIGKILL) is survivable: the job goes on and ends 0, and its last
    line names the worker it lost."""
    victim, _, proc, out, err = kill_mid_job(
        tmp_path, ["-m", "sync", "--workers", "3", "--time-limit", "8"], "w2")
    assert proc.returncode == 0, out + err
    assert "worker2 died (signal 9); the job goes on without it" in err
    last = err.strip().splitlines()[-1]
    assert "; without worker2 (signal 9), which the job lost" in last, last
    assert "the job's model: " in last and last.endswith("/w0/model.safetensors")
    # one process, one name: the launcher's worker2 is the scheduler's worker 2 (rank 2)
    scheduler = logs(job_folder(tmp_path, "sync"))["scheduler.log"]
    assert f"worker 2 (pid {victim} on" in scheduler, scheduler[-2000:]


@pytest.mark.slow
def test_a_ddp_rank_killed_ends_the_job_within_seconds(tmp_path):
    """An all-reduce cannot lose a member: a rank killed mid-training ends the job,
    non-zero, at once (the others do not wait in a collective for ever)."""
    _, after, proc, out, err = kill_mid_job(
        tmp_path, ["-m", "ddp", "--workers", "3", "--time-limit", "120"], "w1")
    assert proc.returncode == 1, out + err
    assert after < 20
    assert "worker1" in err.strip().splitlines()[-1], err


@pytest.mark.slow
def test_under_asgd_the_job_s_model_is_the_servers_last(tmp_path):
    """ASGD's worker 0 stops first; the others push after it. The model file is the
    servers' model after every last push: the newest checkpoint's weights (a
    checkpoint after every update), not worker 0's own."""
    from safetensors.numpy import load_file

    _, seen = esync_run(tmp_path, ["-m", "async", *HETEROGENEOUS, "--max-rounds", "6",
                                   "--checkpoint-dir", str(tmp_path / "ck"),
                                   "--checkpoint-every", "1"], ["--epochs", "50"])
    model = final_model(job_folder(tmp_path, "async"))
    shard = tmp_path / "ck" / "shard0"
    newest = max(shard.glob("round-*"), key=lambda p: int(p.name[6:]))
    assert int(newest.name[6:]) == 3 * 6  # every worker's every push
    weights = load_file(str(newest / "tensors.safetensors"))["weights"]
    flat = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    np.testing.assert_array_equal(flat, weights)


# --- resume -------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_resumed_job_goes_on_with_its_schedule_and_optimizer_as_if_never_stopped(tmp_path):
    """SSGD on two workers (deterministic): 12 rounds straight, against 8 rounds then
    --resume 1 from the checkpoint of round 4 to round 12. Every round's learning rate
    and the final model are the uninterrupted run's: the schedule and AdamW's moments went
    on where they were (from zero, the model differs at once)."""
    common = ["-m", "sync", "--workers", "2", "--checkpoint-every", "4"]
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    for folder in (straight, cut):
        folder.mkdir()
    _, whole = esync_run(straight, [*common, "--checkpoint-dir", str(straight / "ck"),
                                   "--max-rounds", "12"], ["--epochs", "50"])
    esync_run(cut, [*common, "--checkpoint-dir", str(cut / "ck"), "--max-rounds", "8"],
              ["--epochs", "50"])
    assert sorted(os.listdir(cut / "ck" / "worker0")) == [
        "round-4.json", "round-4.safetensors", "round-8.json", "round-8.safetensors"]
    shutil.rmtree(cut / "ck" / "shard0" / "round-8")  # the job was killed after round 7
    _, resumed = esync_run(cut, [*common, "--checkpoint-dir", str(cut / "ck"),
                                 "--max-rounds", "12", "--resume", "1"], ["--epochs", "50"])
    for rank in (0, 1):
        # the resumed script's steps are rounds 5..12: their learning rates are the same
        assert resumed[rank]["lrs"] == pytest.approx(whole[rank]["lrs"][4:], rel=1e-12)
        assert resumed[rank]["last_epoch"] == whole[rank]["last_epoch"] == 12
    a, b = final_model(job_folder(straight, "sync")), final_model(job_folder(cut, "sync"))
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=name)
    log = logs(job_folder(cut, "sync"))["w0/worker.log"]
    assert log.count("# ") >= 2 and "continuing the job from round 5" in log  # appended


# --- files beside the script ---------------------------------------------------------------

@pytest.mark.slow
def test_files_beside_the_script_named_as_esync_s_modules_change_nothing(tmp_path):
    """A config.py, main.py and launch.py of the user's beside the script, and an esync
    checkout in a folder named `esync`: the script trains in a job and alone."""
    project = tmp_path / "proj"
    project.mkdir()
    shutil.copy(SCRIPT, project / "train.py")
    (project / "config.py").write_text("LEARNING_RATE = 'mine'\n")
    (project / "main.py").write_text("raise SystemExit('the user main.py ran')\n")
    (project / "launch.py").write_text("raise SystemExit('the user launch.py ran')\n")
    checkout = project / "esync"
    (checkout / "src" / "esync").mkdir(parents=True)
    (checkout / "README.md").write_text("an esync checkout\n")
    (checkout / "src" / "esync" / "__init__.py").write_text("raise SystemExit('wrong esync')\n")
    esync_run(tmp_path, ["-m", "esync", "--workers", "2", "--max-rounds", "3"],
              script=project / "train.py", cwd=project)
    alone = subprocess.run([sys.executable, str(project / "train.py"), str(tmp_path),
                            "--epochs", "1"], cwd=project, capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, ESYNC_ARGS='["--num-threads", "1"]'))
    assert alone.returncode == 0, alone.stderr


@pytest.mark.slow
def test_the_script_uses_the_device_esync_gives_it(tmp_path):
    """On a GPU worker a batch left on the host crashes the first forward: under the
    tests' virtual device (CUDA's rule on this CPU, tests/virtual_device.py) the
    converted script trains, validates and saves on rank 0 alone, in DDP."""
    site = os.path.join(REPO, "tests", "virtual_device")
    env = dict(os.environ, ESYNC_VIRTUAL_DEVICE="1", PYTHONPATH=os.pathsep.join(
        [site, *filter(None, [os.environ.get("PYTHONPATH")])]))
    seen = tmp_path / "seen"
    seen.mkdir()
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "esync-run"), "--out",
         str(tmp_path / "runs"), "--no-progress", "--num-threads", "1", "-m", "ddp",
         "--workers", "2", "--max-rounds", "8", str(SCRIPT), str(seen), "--val-every", "3"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (seen / "best.pt").exists()
