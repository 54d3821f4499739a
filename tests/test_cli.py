"""The command line: every flag documented, every bad value one clear line and exit 2.

The checks run main.py's `main` in this process (a bad flag stops before anything
heavy starts); one test runs a real `python main.py` to check the same from outside."""
import re

import pytest
import torch

from esync.cli import main
from esync.options import Options, build_parser, parse_options
from tests.helpers import CLUSTER_VARIABLES, run_main


def run_in_process(args, capsys, monkeypatch, env=None):
    """main.py's exit status and its (stdout, stderr), run in this process with exactly
    the cluster variables in `env`."""
    for var in CLUSTER_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    for var, value in (env or {}).items():
        monkeypatch.setenv(var, value)
    capsys.readouterr()
    code = main(list(args), prog="main.py")
    out, err = capsys.readouterr()
    return code, out, err


def _flags():
    parser = build_parser()
    return [a.option_strings for a in parser._actions if a.dest != "help"]


def test_original_flags_kept():
    opts = parse_options(["-l", "0.1", "-ll", "0.2", "-gl", "0.5", "-b", "32", "-dd", "/d",
                          "-c", "True", "-n", "resnet18-v1", "-ld", "/l", "-e", "5",
                          "-m", "esync", "-dcasgd", "1", "-s", "1", "-ip", "10.1.1.34",
                          "-port", "10010", "-g", "1"])
    assert opts == Options(learning_rate=0.1, local_lr=0.2, global_lr=0.5, batch_size=32,
                           data_dir="/d", cpu=True, network="resnet18-v1", log_dir="/l",
                           eval_every=5, mode="esync", use_dcasgd=True, split_by_class=True,
                           state_server_ip="10.1.1.34", state_server_port=10010, gpu=1)


def test_new_flags_parse():
    opts = parse_options(["--dataset", "mnist", "--epochs", "2.5", "--max-rounds", "9",
                          "--time-limit", "60", "--target-accuracy", "0.8", "--shuffle",
                          "once", "--seed", "4", "--device-name", "gpu-fast",
                          "--slowdown", "4", "--block-size", "8", "--buffer-ratio", "0.5"])
    assert (opts.dataset, opts.epochs, opts.max_rounds, opts.time_limit) == ("mnist", 2.5, 9, 60)
    assert (opts.target_accuracy, opts.shuffle, opts.seed) == (0.8, "once", 4)
    assert (opts.device_name, opts.slowdown, opts.block_size, opts.buffer_ratio) == \
        ("gpu-fast", 4.0, 8, 0.5)


def test_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--help"], prog="main.py")
    assert exit.value.code == 0
    stdout = capsys.readouterr().out
    for flags in _flags():
        for flag in flags:
            assert re.search(rf"(^|\s){re.escape(flag)}[\s,]", stdout), flag
    # and each has a description with its default
    assert stdout.count("(default:") == len(_flags())


def test_a_real_process_says_one_line_and_exits_2(tmp_path):
    """What a user sees from `python main.py` with a bad flag, and its --help."""
    result = run_main(["-b", "-3", "--max-rounds", "1", "-ld", str(tmp_path)])
    assert result.returncode == 2
    assert result.stderr == ("main.py: error: argument -b/--batch-size: expected a positive "
                             "integer, got '-3'\n")
    assert result.stdout == "" and not list(tmp_path.iterdir())
    assert run_main(["--help"]).returncode == 0


def test_parsing_flags_does_not_import_torch():
    """Launchers parse worker flags with this parser: it must stay cheap."""
    import subprocess
    import sys

    code = ("import sys; from esync.options import parse_options; "
            "parse_options(['-m', 'esync', '-n', 'resnet18-v1', '--dataset', 'mnist']); "
            "print(sorted(m for m in ('torch', 'numpy', 'zmq') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


BAD = [
    (["-n", "vgg99"], "argument -n/--network: expected one of alexnet, inception-v3, lenet, "
                      "mobilenet-v1, mobilenet-v2, resnet18-v1, resnet50-v1, resnet50-v2, or "
                      "module:function, got 'vgg99'"),
    (["-b", "-3"], "argument -b/--batch-size: expected a positive integer, got '-3'"),
    (["-b", "0"], "argument -b/--batch-size: expected a positive integer"),
    (["-l", "nan"], "argument -l/--learning-rate: expected a positive number"),
    (["-m", "fast"], "argument -m/--mode: invalid choice"),
    (["-c", "maybe"], "argument -c/--cpu: expected 1/0, true/false or yes/no"),
    (["--slowdown", "0.5"], "argument --slowdown: expected a number >= 1"),
    (["--target-accuracy", "1.5"], "argument --target-accuracy: expected a number in (0, 1]"),
    (["-port", "70000"], "argument -port/--state-server-port: expected a port number"),
    (["--dataset", "fashion-mnist", "-dd", "/nonexistent"],
     "-dd/--data-dir: no folder /nonexistent/fashion-mnist"),
    (["-m", "sync"], "-m/--mode sync runs in a cluster: set DMLC_ROLE"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_value_is_one_line_exit_2(args, message, tmp_path, capsys, monkeypatch):
    code, out, err = run_in_process([*args, "--max-rounds", "1", "-ld", str(tmp_path)],
                                    capsys, monkeypatch)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert message in lines[0]
    assert "Traceback" not in err + out


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_gpu_asked_where_there_is_none(tmp_path, capsys, monkeypatch):
    code, out, err = run_in_process(["-g", "0", "--max-rounds", "1", "-ld", str(tmp_path)],
                                    capsys, monkeypatch)
    assert code == 2
    assert err.strip() == ("main.py: error: -g/--gpu 0: this machine has no CUDA "
                           "device; leave out -g (or pass -c 1) to train on the CPU")
    # -c 1 overrides -g, as in the original
    code, out, err = run_in_process(["-g", "0", "-c", "1", "--max-rounds", "1",
                                     "-ld", str(tmp_path)], capsys, monkeypatch)
    assert code == 0, err


CLUSTER = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9", "DMLC_NUM_SERVER": "1",
           "DMLC_NUM_WORKER": "1"}
BAD_ENV = [
    ({"DMLC_ROLE": "worker"}, ["-m", "sync"], "the cluster roles need DMLC_PS_ROOT_URI, "
     "DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER to be set"),
    ({**CLUSTER, "DMLC_ROLE": "boss"}, [], "DMLC_ROLE='boss': expected one of scheduler, server, worker"),
    ({**CLUSTER, "DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "two"}, ["-m", "sync"],
     "DMLC_NUM_WORKER='two': expected a number >= 1"),
    ({**CLUSTER, "DMLC_ROLE": "worker", "PS_HEARTBEAT_TIMEOUT": "0.5"}, ["-m", "sync"],
     "PS_HEARTBEAT_TIMEOUT=0.5 must be longer than PS_HEARTBEAT_INTERVAL=1"),
    ({**CLUSTER, "DMLC_ROLE": "worker"}, ["-m", "local"],
     "-m/--mode local does not run with DMLC_ROLE=worker"),
    ({**CLUSTER, "DMLC_ROLE": "server"}, ["-m", "ddp"],
     "DMLC_ROLE=server: -m ddp runs with torch.distributed's variables"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, ["-m", "ddp"],
     "-m/--mode ddp runs with torch.distributed's variables: set MASTER_PORT"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "5"},
     ["-m", "ddp"], "RANK=2: expected 0..WORLD_SIZE-1"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"},
     ["-m", "ddp"], "MASTER_PORT=0: only rank 0 can pick a free port"),
    ({**CLUSTER, "DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": "no.such.host.invalid"}, [],
     "DMLC_PS_ROOT_URI='no.such.host.invalid': cannot resolve"),
]


@pytest.mark.parametrize("env,args,message", BAD_ENV, ids=[m[:30] for _, _, m in BAD_ENV])
def test_bad_cluster_variables_are_one_line_exit_2(env, args, message, capsys, monkeypatch):
    code, out, err = run_in_process(args, capsys, monkeypatch, env)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"main.py: error: {message}"), lines


def test_interface_address():
    from esync.errors import UserError
    from esync.transport.cluster import interface_address

    assert interface_address("lo") == "127.0.0.1"
    with pytest.raises(UserError, match="DMLC_INTERFACE='nosuch0': no such network interface"):
        interface_address("nosuch0")
