"""esync/logs_tools/summary.py: iteration logs on disk -> BASE/NETWORK/MODE/<Name>.json.

Hand-written log trees under tmp_path; the real script runs as a subprocess for the
command-line behaviour, the library functions for the detailed checks.
"""
import json
import os
import subprocess
import sys

import pytest

from esync.logs_tools import summary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join("src", "esync", "logs_tools", "summary.py")
FIELDS = ["accuracy_list", "val_loss_list", "num_samples_list", "self_iters_list",
          "elapsed_time_list", "aggregate_time_list", "compute_time_list", "bytes_list", "loss_list",
          "rounds_list"]


def run_cli(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def write_round(device_dir, n, time=None, **fields):
    """A round file as the framework writes it (fields override or, None, delete)."""
    record = {"num_iters": n,
              "time": time if time is not None else
              {"0": {"get_batch": 0.25, "forward and backward": 1.0, "local update": 0.25,
                     "global aggregate": 0.5}},
              "num_samples": 64, "total_time": float(n), "loss": 2.0,
              "bytes_sent": 10, "bytes_received": 20, "epoch": 0.1 * n}
    for k, v in fields.items():
        if v is None and k != "loss":
            record.pop(k, None)
        else:
            record[k] = v
    os.makedirs(device_dir, exist_ok=True)
    path = os.path.join(device_dir, f"iter-{n}.json")
    with open(path, "w") as f:
        json.dump(record, f)
    return path


def write_raw(device_dir, name, content):
    os.makedirs(device_dir, exist_ok=True)
    path = os.path.join(device_dir, name)
    with open(path, "wb") as f:
        f.write(content if isinstance(content, bytes) else content.encode())
    return path


def stderr_lines(proc):
    return [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.fixture
def tree(tmp_path):
    """lenet/esync with two hosts: hostA (gpu0 evaluates, cpu does not), hostB (w2, w3)."""
    base = tmp_path / "logs"
    mode = base / "lenet" / "esync"
    gpu0 = str(mode / "hostA" / "gpu0")
    # round 1: ESync's first round, two local iterations, evaluated
    write_round(gpu0, 1, time={
        "0": {"state server": 0.5, "get_batch": 0.25, "forward and backward": 1.0,
              "local update": 0.125},
        "1": {"get_batch": 0.25, "forward and backward": 1.0, "local update": 0.125,
              "slowdown": 2.0, "global update": 0.75}},
        num_samples=128, total_time=5.5, loss=2.5, bytes_sent=1000, bytes_received=1100,
        accuracy=0.125, budget=2, state_server_request=0.01)
    # round 2: one local iteration, loss not finite (null), not evaluated
    write_round(gpu0, 2, time={
        "0": {"state server": 4.0, "get_batch": 0.5, "forward and backward": 1.5,
              "local update": 0.25, "global update": 1.25}},
        num_samples=64, total_time=9.0, loss=None, bytes_sent=500, bytes_received=600,
        budget=1, state_server_request=0.02)
    write_raw(gpu0, ".lock", "1234")
    cpu = str(mode / "hostA" / "cpu")
    write_round(cpu, 1, time={
        "0": {"get_batch": 1.0, "forward and backward": 2.0, "local update": 0.5},
        "1": {"get_batch": 1.0, "forward and backward": 2.0, "local update": 0.5},
        "2": {"get_batch": 1.0, "forward and backward": 2.0, "local update": 0.5,
              "global update": 3.0}},
        num_samples=96, total_time=12.0, loss=1.5, bytes_sent=7, bytes_received=8)
    for dev, samples in (("w2", 32), ("w3", 16)):
        d = str(mode / "hostB" / dev)
        for n in (1, 2, 3):
            write_round(d, n, num_samples=samples, total_time=n * 2.0, loss=3.0 - n)
    return base


EXPECTED_GPU0 = {
    "accuracy_list": [0.125, None],
    "val_loss_list": [None, None],  # an accuracy run: never a val_loss
    "num_samples_list": [128, 64],
    "self_iters_list": [2, 1],
    "elapsed_time_list": [5.5, 9.0],
    "aggregate_time_list": [0.75, 1.25],
    # 0.25+1+0.125 + 0.25+1+0.125+2 ; 0.5+1.5+0.25 ("state server" is not computing)
    "compute_time_list": [4.75, 2.25],
    "bytes_list": [2100, 1100],
    "loss_list": [2.5, None],
    "rounds_list": [1, 2],
}
EXPECTED_CPU = {
    "accuracy_list": [None], "val_loss_list": [None], "num_samples_list": [96], "self_iters_list": [3],
    "elapsed_time_list": [12.0], "aggregate_time_list": [3.0], "compute_time_list": [10.5],
    "bytes_list": [15], "loss_list": [1.5], "rounds_list": [1],
}


def expected_worker(samples):
    return {"accuracy_list": [None] * 3, "val_loss_list": [None] * 3,
            "num_samples_list": [samples] * 3,
            "self_iters_list": [1] * 3, "elapsed_time_list": [2.0, 4.0, 6.0],
            "aggregate_time_list": [0.5] * 3, "compute_time_list": [1.5] * 3,
            "bytes_list": [30] * 3, "loss_list": [2.0, 1.0, 0.0], "rounds_list": [1, 2, 3]}


# --- the output --------------------------------------------------------------------------

def test_cli_writes_exact_summary(tree):
    proc = run_cli("-b", str(tree), "-n", "lenet", "-m", "esync")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = tree / "lenet" / "esync" / "ESync.json"
    text = out.read_text()
    data = json.loads(text)
    assert data == {"hostA": {"gpu0": EXPECTED_GPU0, "cpu": EXPECTED_CPU},
                    "hostB": {"w2": expected_worker(32), "w3": expected_worker(16)}}
    for host in data.values():
        for record in host.values():
            assert list(record) == FIELDS
    assert "NaN" not in text and text.count("\n") > 20  # strict JSON, indented
    # one summary line naming the file and the counts
    lines = proc.stdout.splitlines()
    assert len(lines) == 1
    assert str(out) in lines[0]
    assert "2 host" in lines[0] and "4 device" in lines[0] and "9 round" in lines[0]
    # no temp file left next to it
    assert sorted(os.listdir(tree / "lenet" / "esync")) == ["ESync.json", "hostA", "hostB"]


def test_library_matches_and_ignores_the_previous_output(tree):
    assert summary.main(["-b", str(tree), "-n", "lenet", "-m", "esync"]) == 0
    out = tree / "lenet" / "esync" / "ESync.json"
    first = json.loads(out.read_text())
    # a second run reads the same folders (its own ESync.json is not a host) and replaces it
    out.write_text("stale")
    assert summary.summarize(str(tree), "lenet", "esync") == first
    assert summary.main(["-b", str(tree), "-n", "lenet", "-m", "esync"]) == 0
    assert json.loads(out.read_text()) == first
    assert first["hostA"]["gpu0"] == EXPECTED_GPU0


def test_rounds_sorted_numerically(tmp_path):
    dev = str(tmp_path / "lenet" / "sync" / "h" / "cpu")
    for n in (10, 2, 11, 1, 9, 3, 4, 5, 6, 7, 8):  # written out of order
        write_round(dev, n, total_time=n * 1.5)
    data = summary.summarize(str(tmp_path), "lenet", "sync")
    record = data["h"]["cpu"]
    assert record["rounds_list"] == list(range(1, 12))
    assert record["elapsed_time_list"] == [n * 1.5 for n in range(1, 12)]


def test_unknown_fields_and_phases_ignored(tmp_path):
    dev = str(tmp_path / "n" / "dcasgd" / "h" / "d")
    write_round(dev, 1, time={"0": {"get_batch": 1.0, "mystery phase": 100.0,
                                    "state server": 50.0, "global aggregate": 2.0}},
                something_new={"nested": [1, 2]}, epoch="whatever", budget=None)
    rec = summary.summarize(str(tmp_path), "n", "dcasgd")["h"]["d"]
    assert rec["compute_time_list"] == [1.0]
    assert rec["aggregate_time_list"] == [2.0]
    assert sorted(rec) == sorted(FIELDS)


def test_local_mode_every_round_evaluated(tmp_path):
    dev = str(tmp_path / "lenet" / "local" / "vm" / "cpu")
    for n in (1, 2):
        write_round(dev, n, accuracy=0.5 * n, bytes_sent=0, bytes_received=0)
    proc = run_cli("-b", str(tmp_path), "-n", "lenet", "-m", "local")
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "lenet" / "local" / "Local.json").read_text())["vm"]["cpu"]
    assert rec["accuracy_list"] == [0.5, 1.0]
    assert rec["bytes_list"] == [0, 0]


# --- names -------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, name", [
    ("esync", "ESync"), ("sync", "Sync"), ("async", "Async"), ("dcasgd", "DCASGD"),
    ("local", "Local"), ("esync-niid", "ESync-Non-IID"), ("sync-niid", "Sync-Non-IID"),
    ("async-niid", "Async-Non-IID"), ("dcasgd-niid", "DCASGD-Non-IID"),
    ("local-niid", "Local-Non-IID"), ("my-run", "my-run"), ("ESYNC", "ESYNC"),
    ("esync-niid-2", "esync-niid-2"), ("foo-niid", "foo-niid"),
])
def test_name_of(mode, name):
    assert summary.name_of(mode) == name


@pytest.mark.parametrize("mode, filename", [("sync-niid", "Sync-Non-IID.json"),
                                            ("my-run", "my-run.json")])
def test_cli_output_name(tmp_path, mode, filename):
    write_round(str(tmp_path / "resnet" / mode / "h" / "gpu0"), 1)
    proc = run_cli("-b", str(tmp_path), "-n", "resnet", "-m", mode)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(tmp_path / "resnet" / mode)) == sorted([filename, "h"])
    assert json.loads((tmp_path / "resnet" / mode / filename).read_text())["h"]["gpu0"][
        "rounds_list"] == [1]


# --- broken files ------------------------------------------------------------------------

def _broken(kind, dev):
    """Make iter-2.json broken in the given way; return the expected reason fragment."""
    if kind == "empty":
        write_raw(dev, "iter-2.json", "")
        return "empty"
    if kind == "truncated":
        write_raw(dev, "iter-2.json", '{"num_iters": 2, "time": {"0": {"get_b')
        return "invalid JSON"
    if kind == "garbage":
        write_raw(dev, "iter-2.json", b"\xff\xfe\x00binary")
        return "UTF-8"
    if kind == "nan":
        write_raw(dev, "iter-2.json", json.dumps(
            {"num_iters": 2, "time": {}, "num_samples": 1, "total_time": float("nan"),
             "loss": 1.0, "bytes_sent": 0, "bytes_received": 0}))
        return "invalid JSON"
    if kind == "not object":
        write_raw(dev, "iter-2.json", "[1, 2, 3]")
        return "not a JSON object"
    if kind == "time not object":
        write_round(dev, 2, time=[0.1, 0.2])
        return "'time'"
    if kind == "phases not object":
        write_round(dev, 2, time={"0": 0.5})
        return "'time'"
    if kind == "phase not number":
        write_round(dev, 2, time={"0": {"get_batch": "fast"}})
        return "get_batch"
    if kind == "total_time not number":
        write_round(dev, 2, total_time="5 s")
        return "total_time"
    if kind == "no total_time":
        write_round(dev, 2, total_time=None)
        return "total_time"
    if kind == "num_samples not count":
        write_round(dev, 2, num_samples=True)
        return "num_samples"
    if kind == "bytes not count":
        write_round(dev, 2, bytes_sent="many")
        return "bytes_sent"
    if kind == "loss not number":
        write_round(dev, 2, loss="low")
        return "loss"
    if kind == "accuracy not number":
        write_round(dev, 2, accuracy=[0.5])
        return "accuracy"
    if kind == "val_loss not number":
        write_round(dev, 2, val_loss="0.3")
        return "'val_loss' is not a number"
    if kind == "round mismatch":
        write_round(dev, 2, num_iters=7)
        return "num_iters"
    if kind == "directory":
        os.makedirs(os.path.join(dev, "iter-2.json"))
        return "not a regular file"
    if kind == "fifo":
        os.mkfifo(os.path.join(dev, "iter-2.json"))  # opening it would block forever
        return "not a regular file"
    if kind == "dangling link":
        os.symlink(os.path.join(dev, "nowhere.json"), os.path.join(dev, "iter-2.json"))
        return "missing"
    if kind == "unreadable":
        # a regular file whose read fails (EIO) even for root: the reader's own memory at 0
        os.symlink("/proc/self/mem", os.path.join(dev, "iter-2.json"))
        return "cannot read"
    if kind == "missing":
        return "missing"
    raise AssertionError(kind)


BROKEN = ["empty", "truncated", "garbage", "nan", "not object", "time not object",
          "phases not object", "phase not number", "total_time not number",
          "no total_time", "num_samples not count", "bytes not count", "loss not number",
          "accuracy not number", "val_loss not number", "round mismatch", "directory", "fifo", "dangling link",
          "missing"] + (["unreadable"] if os.path.isfile("/proc/self/mem") else [])


@pytest.mark.parametrize("kind", BROKEN)
def test_broken_file_named_and_skipped(tree, kind, capsys):
    dev = str(tree / "lenet" / "esync" / "hostB" / "w2")
    os.remove(os.path.join(dev, "iter-2.json"))
    reason = _broken(kind, dev)
    assert summary.main(["-b", str(tree), "-n", "lenet", "-m", "esync"]) == 0
    err = capsys.readouterr().err
    bad = os.path.join(dev, "iter-2.json")
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith(f"summary.py: skipped {bad}: "), line
    assert reason in line
    data = json.loads((tree / "lenet" / "esync" / "ESync.json").read_text())
    w2 = data["hostB"]["w2"]
    assert w2["rounds_list"] == [1, 3]
    assert w2["elapsed_time_list"] == [2.0, 6.0]
    assert all(len(w2[k]) == 2 for k in FIELDS)
    # the rest is summarised as before
    assert data["hostA"]["gpu0"] == EXPECTED_GPU0
    assert data["hostB"]["w3"] == expected_worker(16)


def test_cli_broken_file_named_and_skipped(tree):
    dev = str(tree / "lenet" / "esync" / "hostA" / "cpu")
    bad = write_raw(dev, "iter-2.json", '{"num_iters": 2, "time": ')
    write_round(dev, 3, total_time=30.0)
    proc = run_cli("-b", str(tree), "-n", "lenet", "-m", "esync")
    assert proc.returncode == 0, proc.stderr
    assert len(stderr_lines(proc)) == 1
    assert stderr_lines(proc)[0].startswith(f"summary.py: skipped {bad}: invalid JSON")
    data = json.loads((tree / "lenet" / "esync" / "ESync.json").read_text())
    assert data["hostA"]["cpu"]["rounds_list"] == [1, 3]
    assert data["hostA"]["cpu"]["elapsed_time_list"] == [12.0, 30.0]
    assert "10 round" in proc.stdout  # 2 + 2 + 3 + 3


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_named_and_skipped(tree):
    dev = tree / "lenet" / "esync" / "hostB" / "w3"
    bad = dev / "iter-1.json"
    bad.chmod(0)
    try:
        proc = run_cli("-b", str(tree), "-n", "lenet", "-m", "esync")
    finally:
        bad.chmod(0o644)
    assert proc.returncode == 0
    assert stderr_lines(proc) == [f"summary.py: skipped {bad}: cannot read: Permission denied"]
    data = json.loads((tree / "lenet" / "esync" / "ESync.json").read_text())
    assert data["hostB"]["w3"]["rounds_list"] == [2, 3]


def test_gaps_reported_by_name(tmp_path):
    dev = str(tmp_path / "n" / "async" / "h" / "d")
    for n in (3, 4, 9):
        write_round(dev, n)
    lines = []
    rec = summary.summarize(str(tmp_path), "n", "async", warn=lines.append)["h"]["d"]
    assert rec["rounds_list"] == [3, 4, 9]
    assert lines == [
        f"summary.py: skipped {os.path.join(dev, 'iter-1.json')} .. iter-2.json: missing (2 files)",
        f"summary.py: skipped {os.path.join(dev, 'iter-5.json')} .. iter-8.json: missing (4 files)",
    ]


def test_several_broken_files_each_reported(tree):
    dev = str(tree / "lenet" / "esync" / "hostA" / "gpu0")
    write_raw(dev, "iter-3.json", "")
    write_raw(dev, "iter-4.json", "{")
    write_round(dev, 5, total_time=20.0, accuracy=0.75)
    lines = []
    rec = summary.summarize(str(tree), "lenet", "esync", warn=lines.append)["hostA"]["gpu0"]
    assert rec["rounds_list"] == [1, 2, 5]
    assert rec["accuracy_list"] == [0.125, None, 0.75]
    assert len(lines) == 2
    assert lines[0].startswith(f"summary.py: skipped {os.path.join(dev, 'iter-3.json')}: ")
    assert lines[1].startswith(f"summary.py: skipped {os.path.join(dev, 'iter-4.json')}: ")


def test_temp_lock_and_other_files_ignored_silently(tree):
    dev = str(tree / "lenet" / "esync" / "hostB" / "w3")
    write_raw(dev, "iter-4.json.partial", '{"num_iters": 4, "ti')
    write_raw(dev, ".lock", "99")
    write_raw(dev, "notes.txt", "hello")
    write_raw(dev, "iter-x.json", "{")
    write_raw(dev, "iter-5.txt", "{")
    write_raw(str(tree / "lenet" / "esync"), "README", "not a host")
    write_raw(str(tree / "lenet" / "esync" / "hostB"), "stray.json", "not a device")
    proc = run_cli("-b", str(tree), "-n", "lenet", "-m", "esync")
    assert proc.returncode == 0
    assert proc.stderr == ""
    data = json.loads((tree / "lenet" / "esync" / "ESync.json").read_text())
    assert data["hostB"]["w3"] == expected_worker(16)
    assert sorted(data) == ["hostA", "hostB"]


def test_all_broken_device_left_out(tree):
    mode = tree / "lenet" / "esync"
    dead = str(mode / "hostB" / "w4")
    write_raw(dead, "iter-1.json", "")
    write_raw(dead, "iter-2.json", "nope")
    empty = str(mode / "hostA" / "gpu1")
    write_raw(empty, ".lock", "1")  # a process that never finished a round
    proc = run_cli("-b", str(tree), "-n", "lenet", "-m", "esync")
    assert proc.returncode == 0, proc.stderr
    lines = stderr_lines(proc)
    assert f"summary.py: skipped {empty}: no usable iteration files" in lines
    assert f"summary.py: skipped {dead}: no usable iteration files" in lines
    assert any(line.startswith(f"summary.py: skipped {os.path.join(dead, 'iter-1.json')}: ")
               for line in lines)
    assert len(lines) == 4
    data = json.loads((mode / "ESync.json").read_text())
    assert sorted(data["hostA"]) == ["cpu", "gpu0"]
    assert sorted(data["hostB"]) == ["w2", "w3"]


def test_host_without_usable_device_left_out(tree):
    write_raw(str(tree / "lenet" / "esync" / "hostC" / "cpu"), "iter-1.json", "[]")
    os.makedirs(tree / "lenet" / "esync" / "hostD")
    lines = []
    data = summary.summarize(str(tree), "lenet", "esync", warn=lines.append)
    assert sorted(data) == ["hostA", "hostB"]
    assert f"summary.py: skipped {tree / 'lenet' / 'esync' / 'hostD'}: no device folders" \
        in lines


# --- fatal errors and flags --------------------------------------------------------------

def _assert_fatal(proc, folder, out):
    assert proc.returncode == 2
    lines = stderr_lines(proc)
    assert len(lines) == 1, lines
    assert lines[0].startswith("summary.py: error: ")
    assert str(folder) in lines[0]
    assert proc.stdout == ""
    assert not os.path.exists(out)


def test_missing_folder_exit_2(tmp_path):
    proc = run_cli("-b", str(tmp_path / "nowhere"), "-n", "lenet", "-m", "esync")
    _assert_fatal(proc, tmp_path / "nowhere" / "lenet" / "esync",
                  tmp_path / "nowhere" / "lenet" / "esync" / "ESync.json")
    assert not os.path.exists(tmp_path / "nowhere")


def test_missing_mode_folder_exit_2(tree):
    proc = run_cli("-b", str(tree), "-n", "lenet", "-m", "sync")
    _assert_fatal(proc, tree / "lenet" / "sync", tree / "lenet" / "sync" / "Sync.json")


def test_no_device_folders_exit_2(tmp_path):
    mode = tmp_path / "lenet" / "esync"
    os.makedirs(mode / "hostA")  # a host without devices
    write_raw(str(mode), "iter-1.json", "{}")  # files at the wrong level are not devices
    proc = run_cli("-b", str(tmp_path), "-n", "lenet", "-m", "esync")
    assert proc.returncode == 2
    assert stderr_lines(proc)[-1].startswith("summary.py: error: ")
    assert str(mode) in stderr_lines(proc)[-1]
    assert not os.path.exists(mode / "ESync.json")
    with pytest.raises(summary.SummaryError):
        summary.summarize(str(tmp_path), "lenet", "esync", warn=lambda line: None)


def test_nothing_usable_exit_2_keeps_old_output(tmp_path):
    mode = tmp_path / "lenet" / "esync"
    write_raw(str(mode / "h" / "cpu"), "iter-1.json", "")
    write_raw(str(mode), "ESync.json", '{"old": {}}')
    proc = run_cli("-b", str(tmp_path), "-n", "lenet", "-m", "esync")
    assert proc.returncode == 2
    assert stderr_lines(proc)[-1].startswith("summary.py: error: ")
    assert (mode / "ESync.json").read_text() == '{"old": {}}'


@pytest.mark.parametrize("args", [
    [], ["-n", "lenet"], ["-m", "esync"], ["-n", "lenet", "-m", "esync", "--bogus"],
    ["-n", "lenet", "-m", ""], ["-n", "lenet", "-m", "a/b"], ["-n", "..", "-m", "esync"],
])
def test_bad_flags_exit_2(tmp_path, args):
    proc = run_cli("-b", str(tmp_path), *args)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr
    assert os.listdir(tmp_path) == []


def test_trailing_slash_in_mode(tree):
    proc = run_cli("-b", str(tree), "-n", "lenet/", "-m", "esync/")
    assert proc.returncode == 0, proc.stderr
    assert (tree / "lenet" / "esync" / "ESync.json").is_file()


def test_imports_only_the_registry_of_esync_and_no_torch():
    code = ("import sys; import esync.logs_tools.summary as s; "
            "assert callable(s.summarize) and callable(s.main) and callable(s.name_of); "
            # the tool's own package aside
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('esync', 'torch') "
            "and not m.startswith(('esync.launch', 'esync.logs_tools', 'esync.config'))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['esync', 'esync.logs', 'esync.logs.breakdown', 'esync.registry']"


def test_names_come_from_the_registry():
    from esync import registry
    for algorithm, split in registry.all_folders():
        folder = algorithm.log_folder(split)
        assert summary.name_of(folder) == algorithm.summary_name(split)
    assert not hasattr(summary, "NAMES")


def test_base_dir_defaults_to_config_log_dir():
    from esync import config
    assert summary.build_parser().parse_args(["-n", "x", "-m", "y"]).base_dir == config.LOG_DIR


# --- the evaluator's device folder, and the drawer on top (DDP and the evaluator) --------

def write_evaluator(device_dir, evaluations):
    """An evaluator's folder as esync/runtime/evaluator.py writes it: one file per evaluation
    (time on the training clock, the model's round, its accuracy), no samples, no loss,
    the phases `pull` and `evaluate`, the bytes of one pull."""
    for n, (at, model_round, accuracy) in enumerate(evaluations, 1):
        write_round(device_dir, n, time={"0": {"pull": 0.01, "evaluate": 0.05}},
                    num_samples=0, total_time=at, loss=None, bytes_sent=40,
                    bytes_received=250_000, accuracy=accuracy, round=model_round,
                    epoch=None)


def write_job(base, folder, worker_times, evaluations, worker0_accuracies=None):
    """BASE/lenet/FOLDER/h: workers w0 and w1 (64 samples, 1.5 s of computing, 0.5 s of
    aggregation and 30 bytes a round, ending at worker_times[-1]; w0 with
    worker0_accuracies if given) and the evaluator."""
    host = base / "lenet" / folder / "h"
    for device in ("w0", "w1"):
        accuracies = worker0_accuracies if device == "w0" and worker0_accuracies \
            else [None] * len(worker_times)
        for n, (at, accuracy) in enumerate(zip(worker_times, accuracies), 1):
            write_round(str(host / device), n, total_time=at, accuracy=accuracy)
    write_evaluator(str(host / "evaluator"), evaluations)


def test_evaluator_is_summarised_as_a_device_with_an_accuracy_every_round(tmp_path):
    evaluations = [(0.0, 0, 0.1), (0.5, 3, 0.6), (1.0, 7, 0.85), (1.5, 7, 0.9), (3.5, 12, 0.95)]
    write_job(tmp_path, "sync", [1.0, 2.0, 3.0], evaluations)
    lines = []
    out, data = summary.write_summary(str(tmp_path), "lenet", "sync", warn=lines.append)
    assert lines == []
    assert out == str(tmp_path / "lenet" / "sync" / "Sync.json")
    assert json.loads(open(out).read()) == data
    assert sorted(data["h"]) == ["evaluator", "w0", "w1"]
    evaluator = data["h"]["evaluator"]
    assert list(evaluator) == FIELDS
    assert evaluator == {
        "accuracy_list": [a for _, _, a in evaluations],  # every round has one
        "val_loss_list": [None] * 5,
        "num_samples_list": [0] * 5,                     # it trains on nothing
        "self_iters_list": [1] * 5,
        "elapsed_time_list": [at for at, _, _ in evaluations],  # may outlast the workers
        "aggregate_time_list": [0.0] * 5,  # `pull` is neither aggregation ...
        "compute_time_list": [0.0] * 5,    # ... nor `evaluate` computing
        "bytes_list": [250_040] * 5,
        "loss_list": [None] * 5,
        "rounds_list": [1, 2, 3, 4, 5],    # its evaluations (the model's round aside)
    }
    for device in ("w0", "w1"):
        assert data["h"][device]["accuracy_list"] == [None] * 3
        assert data["h"][device]["num_samples_list"] == [64] * 3
    assert "1 host(s), 3 device(s), 11 round(s)" in summary.wrote_line(out, data)


def test_drawer_times_ddp_by_its_evaluator(tmp_path):
    from esync.logs_tools import drawer

    # SSGD: its evaluator sees 0.8 first at 5 s
    write_job(tmp_path, "sync", [2.0, 4.0, 6.0],
              [(0.0, 0, 0.1), (2.5, 5, 0.6), (5.0, 9, 0.82), (6.0, 11, 0.9)])
    # DDP: worker 0 evaluates too, and would say 0.8 at 1 s; the evaluator, 0.8 at
    # 2.5 s, is the job's measure: 5 / 2.5 = 2x over SSGD. It goes on after the workers
    # end at 3 s (not counted in throughput).
    write_job(tmp_path, "ddp", [1.0, 2.0, 3.0],
              [(0.0, 0, 0.1), (1.0, 4, 0.5), (2.5, 9, 0.81), (3.0, 11, 0.86), (4.0, 11, 0.87)],
              worker0_accuracies=[0.8, 0.9, 0.95])
    for mode in ("sync", "ddp"):
        summary.write_summary(str(tmp_path), "lenet", mode, warn=lambda line: None)
    table = drawer.draw(str(tmp_path), "lenet", target=0.8)

    rows = {r["algorithm"]: r for r in
            json.loads((tmp_path / "lenet" / "speedup.json").read_text())["rows"]}
    assert sorted(rows) == ["DDP", "SSGD"]
    ddp = rows["DDP"]
    assert ddp["evaluating_device"] == "h/evaluator"
    assert ddp["time_to_target_s"] == 2.5
    assert ddp["speedup_vs_ssgd"] == 2.0
    assert ddp["final_accuracy"] == 0.87 and ddp["best_accuracy"] == 0.87
    assert rows["SSGD"]["time_to_target_s"] == 5.0
    assert "| DDP | 2.50 | 2.00x | 0.8700 | 0.8700 | n/a |" in table.splitlines()
    assert table == (tmp_path / "lenet" / "speedup.md").read_text().split("\n\n", 1)[1]
    doc = json.loads((tmp_path / "lenet" / "speedup.json").read_text())
    # two workers, 3 rounds of 64 samples each, over their 3 s (the evaluator's 4 s and
    # its bytes left out)
    assert doc["throughput_samples_per_s"]["DDP"] == pytest.approx(2 * 3 * 64 / 3.0)
    assert doc["traffic_MB_per_s"]["DDP"] == pytest.approx(2 * 3 * 30 / 3.0 / 1e6)
    assert sorted(doc["computing_ratio"]["DDP"]) == ["h/w0", "h/w1"]
    for name in drawer.OUTPUTS:
        assert (tmp_path / "lenet" / name).stat().st_size > 0


# --- runs of `--metric loss`: val_loss in place of accuracy ------------------------------

def write_loss_job(base, folder):
    """BASE/lenet/FOLDER/h as a `--metric loss` job writes it: worker w0 (3 rounds, no
    evaluation) and the evaluator, whose records carry `val_loss` where an accuracy run's
    carry `accuracy`."""
    host = base / "lenet" / folder / "h"
    for n in (1, 2, 3):
        write_round(str(host / "w0"), n, total_time=float(n))
    for n, (at, val_loss) in enumerate([(0.0, 2.5), (1.5, 1.25), (3.0, 0.5)], 1):
        write_round(str(host / "evaluator"), n, time={"0": {"pull": 0.01, "evaluate": 0.05}},
                    num_samples=0, total_time=at, loss=None, bytes_sent=40,
                    bytes_received=250_000, val_loss=val_loss, epoch=None)
    return host


def test_val_loss_list_beside_accuracy_list(tmp_path):
    write_loss_job(tmp_path, "esync")
    # a standalone process evaluates itself every other round (a val_loss of 0 is one)
    local = str(tmp_path / "lenet" / "local" / "h" / "cpu")
    for n, val_loss in enumerate([1.0, None, 0], 1):
        write_round(local, n, val_loss=val_loss)
    proc = run_cli("-b", str(tmp_path), "-n", "lenet", "-m", "esync")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    data = json.loads((tmp_path / "lenet" / "esync" / "ESync.json").read_text())
    evaluator, worker = data["h"]["evaluator"], data["h"]["w0"]
    assert list(evaluator) == FIELDS and list(worker) == FIELDS
    assert evaluator["val_loss_list"] == [2.5, 1.25, 0.5]
    assert evaluator["accuracy_list"] == [None] * 3  # a job has one metric
    assert evaluator["elapsed_time_list"] == [0.0, 1.5, 3.0]
    assert worker["val_loss_list"] == [None] * 3  # did not evaluate
    assert worker["num_samples_list"] == [64] * 3  # the rest as for accuracy runs
    rec = summary.summarize(str(tmp_path), "lenet", "local")["h"]["cpu"]
    assert rec["val_loss_list"] == [1.0, None, 0]
    assert rec["accuracy_list"] == [None] * 3


def test_broken_val_loss_named_and_skipped(tmp_path):
    dev = str(write_loss_job(tmp_path, "sync") / "evaluator")
    bad = write_round(dev, 2, time={"0": {"evaluate": 0.05}}, total_time=1.5,
                      val_loss=[1.25])
    lines = []
    data = summary.summarize(str(tmp_path), "lenet", "sync", warn=lines.append)
    assert lines == [f"summary.py: skipped {bad}: 'val_loss' is not a number: [1.25]"]
    assert data["h"]["evaluator"]["val_loss_list"] == [2.5, 0.5]
    assert data["h"]["evaluator"]["rounds_list"] == [1, 3]


def test_drawer_draws_a_loss_run_from_its_summary(tmp_path):
    """Iteration files -> summary -> the drawer: the val_loss curve and table."""
    from esync.logs_tools import drawer

    write_loss_job(tmp_path, "sync")
    summary.write_summary(str(tmp_path), "lenet", "sync", warn=lambda line: None)
    data = drawer.load_all(str(tmp_path), "lenet")
    ssgd = data[("SSGD", False)]
    assert drawer.metric_of(ssgd) == "val_loss"
    assert drawer.metric_curve(ssgd) == ([0.0, 1.5, 3.0], [2.5, 1.25, 0.5])
    assert drawer.time_to_target(ssgd, 1.25) == 1.5  # at or below
    table = drawer.draw(str(tmp_path), "lenet", target_loss=1.0)
    assert "| SSGD | 3.00 | 1.00x | 0.5000 | 0.5000 | n/a |" in table.splitlines()
    for name in drawer.OUTPUTS:
        assert (tmp_path / "lenet" / name).stat().st_size > 0
