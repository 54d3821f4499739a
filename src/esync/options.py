"""The run's settings: one dataclass, parsed from the command line by argparse-dataclass.
This module only parses: what the settings mean together is checked where they are used
(the algorithms' own checks: esync.algorithms.policy.check_aggregation; plug-ins and the settings
a job's nodes agree on: esync.runtime.startup).

main.py's own flags are the fields of `_MainFlags`, in --help's order (the flag pages are
generated from this parser). Some of them are an algorithm's (marked with the policy,
esync.algorithms, that names them in its `FLAGS`, takes their defaults and checks
them). An algorithm added since declares its flags on its policy's own fields
(esync.flagtypes.flag: local SGD's --period), and `Options` collects them from the
registry's policies: its unit brings them, and no line here names them.

Every flag of the original ESync is kept with its short form (`-l`, `-ll`, `-gl`, `-b`,
`-dd`, `-g`, `-c`, `-n`, `-ld`, `-e`, `-m`, `-dcasgd`, `-s`, `-ip`, `-port`), so that its
users' commands still work; defaults come from the top-level `esync/config.py`.

Parsing imports nothing heavy (no torch): the launchers parse the flags they pass to
workers with this same parser, so that a bad flag is refused before anything starts.
"""

import argparse
import dataclasses
import math
import sys
import typing
from dataclasses import dataclass, fields, make_dataclass
from typing import Annotated, Optional, Sequence, Set

from argparse_dataclass import ArgumentParser

from esync import config
from esync.data import DATA_SPLITS, DATASETS, METRICS, SHARDS_PREFIX, SHUFFLES
from esync.errors import UserError
from esync.flagtypes import (cache_fraction as _cache_fraction, flag as _opt, fraction as _fraction,
                             momentum as _momentum, non_negative_float as _non_negative_float,
                             non_negative_int as _non_negative_int, port as _port,
                             positive_float as _positive_float, positive_int as _positive_int,
                             slowdown as _slowdown, switch as _switch)
from esync.models import NETWORKS
from esync.infra.plugin import is_spec
from esync.comm.compress import Compression
from esync.registry import ALGORITHMS, BACKENDS, MODES, Algorithm, of_options

#: the variable in which esync-run hands a training script these flags (a JSON list of
#: strings), for esync.init to parse
ARGS_VARIABLE = "ESYNC_ARGS"

# A bool that takes a value (`-c 1`, `-s True`), as the original's flags did. The
# annotation keeps argparse-dataclass from turning it into a value-less switch.
Switch = Annotated[bool, "takes a value: 1/0, true/false, yes/no"]


def _network(text: str) -> str:
    """-n: a built-in network's name, or a plug-in's module:function (its form only:
    esync.models imports and checks it where the network is built)."""
    if text in NETWORKS or is_spec(text):
        return text
    raise argparse.ArgumentTypeError(f"expected one of {', '.join(sorted(NETWORKS))}, or "
                                     f"module:function, got {text!r}")


def _dataset(text: str) -> str:
    """--dataset: a built-in data set's name, shards:DIR, or a plug-in's module:function."""
    if text in DATASETS or is_spec(text) or (text.startswith(SHARDS_PREFIX)
                                             and len(text) > len(SHARDS_PREFIX)):
        return text
    raise argparse.ArgumentTypeError(f"expected one of {', '.join(DATASETS)}, "
                                     f"{SHARDS_PREFIX}DIR or module:function, got {text!r}")


def _loss(text: str) -> str:
    """--loss: cross_entropy, or a plug-in's module:function."""
    if text == "cross_entropy" or is_spec(text):
        return text
    raise argparse.ArgumentTypeError(f"expected cross_entropy or module:function, got "
                                     f"{text!r}")


def _compress(text: str) -> str:
    """--compress: one of esync.comm.compress.SPELLING, kept as text (esync.comm.compress parses
    it)."""
    try:
        return str(Compression.parse(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _every(text: str) -> str:
    """--checkpoint-every: N (rounds, N >= 1) or Ns (seconds, > 0), kept as text."""
    low = text.strip().lower()
    try:
        value = float(low[:-1]) if low.endswith("s") else int(low)
    except ValueError:
        value = 0
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected N rounds (an integer >= 1) or Ns "
                                         f"seconds (e.g. 30s), got {text!r}")
    return low


@dataclass
class _MainFlags:
    """Settings of one process of a run (worker, server, scheduler or standalone)."""

    learning_rate: float = _opt(["-l", "--learning-rate"], config.LEARNING_RATE,
                                "SGD learning rate of local, sync, async and localsgd modes",
                                type=_positive_float)
    local_lr: float = _opt(["-ll", "--local-lr"], config.LEARNING_RATE_LOCAL,
                           "local SGD learning rate of esync", type=_positive_float)
    momentum: float = _opt(["--momentum"], config.MOMENTUM, "SGD momentum in [0, 1)",
                           type=_momentum)
    weight_decay: float = _opt(["--weight-decay"], config.WEIGHT_DECAY, "SGD weight decay",
                               type=_non_negative_float)
    batch_size: int = _opt(["-b", "--batch-size"], config.BATCH_SIZE,
                           "samples per local iteration on each device", type=_positive_int)
    data_dir: str = _opt(["-dd", "--data-dir"], config.DATA_DIR,
                         "folder holding fashion-mnist/ and mnist/ with the IDX files")
    gpu: Optional[int] = _opt(["-g", "--gpu"], config.DEFAULT_GPU_ID,
                              "train on cuda:N; without it the CPU is used",
                              type=_non_negative_int)
    cpu: Switch = _opt(["-c", "--cpu"], config.USE_CPU,
                       "1: use the CPU even if -g is given", type=_switch)
    network: str = _opt(["-n", "--network"], config.NETWORK,
                        f"network to train: {', '.join(sorted(NETWORKS))}, or a plug-in "
                        f"module:function returning a torch.nn.Module", type=_network,
                        metavar="NAME")
    log_dir: str = _opt(["-ld", "--log-dir"], config.LOG_DIR,
                        "where LOG_DIR/<host>/<device>/iter-<n>.json are written")
    tensorboard: Optional[str] = _opt(["--tensorboard"], config.TENSORBOARD,
                                      "also write each round's loss, samples, budget and "
                                      "bytes (the evaluator: its accuracy) as TensorBoard "
                                      "scalars into DIR/<host>/<device>/; none: no "
                                      "TensorBoard")
    eval_every: int = _opt(["-e", "--eval-duration"], config.EVAL_DURATION,
                           "worker 0 evaluates test accuracy every N rounds, 0: never "
                           "(local mode: a round is N iterations and is evaluated)",
                           type=_non_negative_int)
    eval_interval: float = _opt(["--eval-interval"], config.EVAL_INTERVAL,
                                "seconds between the evaluator's evaluations of the global "
                                "model (DMLC_ROLE=evaluator); -m local with -e 0: between "
                                "its own, the clock paused meanwhile",
                                type=_positive_float)
    target_hold: float = _opt(["--target-hold"], config.TARGET_HOLD,
                              "evaluator: end the job once --target-accuracy has held this "
                              "many seconds", type=_non_negative_float)
    mode: str = _opt(["-m", "--mode"], config.MODE, "training algorithm", choices=MODES)
    use_dcasgd: Switch = _opt(["-dcasgd", "--use-dcasgd"], config.DCASGD,
                              "1: delay-compensated ASGD (with -m async)", type=_switch)
    # selects speed-balanced DDP (esync.algorithms.ddp.BalancedDDP: its --min-batch)
    balance_batches: Switch = _opt(["--balance-batches"], config.BALANCE_BATCHES,
                                   "ddp: 1: each worker's batch in proportion to its measured "
                                   "speed, re-estimated as it trains, the global batch (-b "
                                   "times the workers; see --global-batch) and the learning "
                                   "rate unchanged (LB-BSP)", type=_switch)
    backend: str = _opt(["--backend"], config.BACKEND,
                        "sync, esync, localsgd: aggregate through the parameter servers (ps) or by "
                        "all-reduce among the workers (allreduce, with DMLC_NUM_SERVER=0)",
                        choices=list(BACKENDS))
    compress: str = _opt(["--compress"], config.COMPRESS,
                         "pushed weight traffic: none, fp16 (half the bytes), topk:R (the "
                         "largest fraction R of the values, with error feedback), "
                         "threshold:T (the values over T in magnitude, with error "
                         "feedback; threshold:auto:F: T chosen to keep about the fraction "
                         "F), partial:K (sync, esync, localsgd: each round one of K slices "
                         "in turn, the rest local)",
                         type=_compress)
    split_by_class: Switch = _opt(["-s", "--split-by-class"], config.SPLIT_BY_CLASS,
                                  "1: non-IID partitions, each worker sees few classes",
                                  type=_switch)
    state_server_ip: str = _opt(["-ip", "--state-server-ip"], config.STATE_SERVER_IP,
                                "address of the ESync state server")
    state_server_port: int = _opt(["-port", "--state-server-port"], config.STATE_SERVER_PORT,
                                  "port of the ESync state server", type=_port)
    dataset: str = _opt(["--dataset"], config.DATASET,
                        f"data set: {', '.join(DATASETS)} (folder and cifar10 read "
                        f"--data-dir), {SHARDS_PREFIX}DIR (shards written by esync-pack), "
                        f"or module:function returning the training and test torch "
                        f"Datasets", type=_dataset, metavar="NAME")
    loss: str = _opt(["--loss"], config.LOSS,
                     "the training loss, a function (output, target) -> scalar: "
                     "cross_entropy, or module:function returning one", type=_loss)
    metric: str = _opt(["--metric"], config.METRIC,
                       "what evaluations measure on the test set: accuracy (top-1, "
                       "higher is better) or loss (--loss's mean, lower is better)",
                       choices=METRICS)
    evaluate: Optional[str] = _opt(["--evaluate"], config.EVALUATE,
                                   "the evaluation itself, a plug-in module:function "
                                   "(model, test_set, device) -> float measuring the "
                                   "model (in evaluation mode, without gradients) on the "
                                   "test set of --dataset, whose samples may then have any "
                                   "form; --metric says whether higher (accuracy) or "
                                   "lower (loss) is better; none: --metric's own "
                                   "measure on (inputs..., target) samples",
                                   metavar="MODULE:FUNCTION")
    epochs: Optional[float] = _opt(["--epochs"], config.EPOCHS,
                                   "stop after this many passes over the partition",
                                   type=_positive_float)
    max_rounds: Optional[int] = _opt(["--max-rounds"], config.MAX_ROUNDS,
                                     "stop after this many rounds", type=_positive_int)
    time_limit: Optional[float] = _opt(["--time-limit"], config.TIME_LIMIT,
                                       "stop after this many seconds of training",
                                       type=_positive_float)
    target_accuracy: Optional[float] = _opt(["--target-accuracy"], config.TARGET_ACCURACY,
                                            "stop once test accuracy reaches this",
                                            type=_fraction)
    target_loss: Optional[float] = _opt(["--target-loss"], config.TARGET_LOSS,
                                        "stop once the evaluated loss falls to this (a "
                                        "metric where lower is better)",
                                        type=_non_negative_float)
    shuffle: str = _opt(["--shuffle"], config.SHUFFLE, "order of samples in each epoch "
                        "of a loader that shuffles: random (a new permutation, as "
                        "DataLoader's shuffle=True; shards: corgipile, as they are read "
                        "block by block), corgipile (blocks of --block-size samples, "
                        "shuffled in a buffer of --buffer-ratio), once, none",
                        choices=SHUFFLES)
    block_size: int = _opt(["--block-size"], config.BLOCK_SIZE,
                           "contiguous samples per CorgiPile block", type=_positive_int)
    buffer_ratio: float = _opt(["--buffer-ratio"], config.BUFFER_RATIO,
                               "share of the partition in CorgiPile's shuffle buffer",
                               type=_fraction)
    data_split: Optional[str] = _opt(
        ["--data-split"], config.DATA_SPLIT, "static: each worker trains its own equal "
        "share of the data; leased: the scheduler leases blocks of shards to whichever "
        "worker asks, so every sample is trained once an epoch whatever the speeds; "
        "whole (map-style data, -m sync, async, esync...): every worker draws from the "
        "whole data set in its own order, so that one that trains more, or alone, "
        "does not go round its own share "
        "(unset: leased for shards in a job with a scheduler and no -s 1, whole for "
        "map-style data in those modes without -s 1, static otherwise)",
        choices=DATA_SPLITS)
    loader_workers: int = _opt(["--loader-workers"], config.LOADER_WORKERS,
                               "DataLoader worker processes that decode the built-in "
                               "loop's data read from disk (0: the training process)",
                               type=_non_negative_int)
    cache_fraction: float = _opt(["--cache-fraction"], config.CACHE_FRACTION,
                                 "share of a worker's shard samples kept in memory after "
                                 "their first read and never evicted (MinIO's policy): "
                                 "the same seeded subset every epoch; 0: no cache",
                                 type=_cache_fraction)
    disk_bandwidth: Optional[float] = _opt(["--disk-bandwidth"], config.DISK_BANDWIDTH,
                                           "MB/s of emulated storage: a block of shards "
                                           "takes at least its bytes over this to read; "
                                           "none: the disk's own speed",
                                           type=_positive_float)
    remote_prep: Optional[float] = _opt(["--remote-prep"], config.REMOTE_PREP,
                                        "with esync-launch --ray: once a round's prep stall "
                                        "(waiting for decoding) exceeds this share of its "
                                        "time, the worker's batches are decoded by Ray "
                                        "tasks on CPUs the cluster has free; none: never",
                                        type=_fraction)
    log_samples: Switch = _opt(["--log-samples"], config.LOG_SAMPLES,
                               "1: each round's record lists the ids of its samples "
                               "(shards)", type=_switch)
    seed: int = _opt(["--seed"], config.SEED, "seed of model init, partitions and shuffles",
                     type=_non_negative_int)
    device_name: str = _opt(["--device-name"], "",
                            "label of the log folder; empty: cpu or gpu<N>")
    slowdown: float = _opt(["--slowdown"], config.SLOWDOWN,
                           "act as a device F times slower: wait until each local "
                           "iteration's computing has lasted F times the recent "
                           "iterations' lower quartile (their CPU time on a CPU with "
                           "one torch thread, else wall time), part of the wait before "
                           "the computing so that it falls anywhere in the iteration; an "
                           "iteration that took longer shortens the next waits",
                           type=_slowdown)
    bandwidth: Optional[float] = _opt(["--bandwidth"], config.BANDWIDTH,
                                      "Mbit/s of this worker's emulated link, each way: its "
                                      "kvstore or all-reduce traffic is paced to it",
                                      type=_positive_float)
    latency: float = _opt(["--latency"], config.LATENCY,
                          "ms of one-way delay of this worker's emulated link",
                          type=_non_negative_float)
    checkpoint_dir: Optional[str] = _opt(["--checkpoint-dir"], config.CHECKPOINT_DIR,
                                         "servers checkpoint their shards into "
                                         "DIR/shard<k>/ (and the scheduler the job id into "
                                         "DIR/job.json); none: no checkpoints")
    checkpoint_every: str = _opt(["--checkpoint-every"], config.CHECKPOINT_EVERY,
                                 "N: every N rounds of the model (ASGD: N updates of a "
                                 "shard); Ns: every N seconds", type=_every)
    keep_checkpoints: int = _opt(["--keep-checkpoints"], config.KEEP_CHECKPOINTS,
                                 "checkpoints kept per shard (the newest)",
                                 type=_positive_int)
    resume: Switch = _opt(["--resume"], False,
                          "1: continue the job from the latest complete checkpoint in "
                          "--checkpoint-dir (give it to every role)", type=_switch)
    on_worker_failure: str = _opt(["--on-worker-failure"], config.ON_WORKER_FAILURE,
                                  "scheduler: a dead worker is left behind (continue) or "
                                  "ends the job (abort)", choices=["continue", "abort"])
    min_workers: int = _opt(["--min-workers"], config.MIN_WORKERS,
                            "scheduler: end the job when fewer workers are alive",
                            type=_positive_int)
    server_patience: Optional[float] = _opt(
        ["--server-patience"], None,
        f"scheduler: seconds to wait for a dead server to be restarted before ending the "
        f"job; none: {config.SERVER_PATIENCE:g} with --checkpoint-dir, else 0",
        type=_non_negative_float)
    start_timeout: float = _opt(["--start-timeout"], config.START_TIMEOUT,
                                "seconds a server, worker or evaluator waits to join the "
                                "job, and the scheduler for every node to register, before "
                                "giving up with who is missing; 0: wait for ever",
                                type=_non_negative_float)
    num_threads: int = _opt(["--num-threads"], config.NUM_THREADS,
                            "torch intra-op threads (0: torch's default)",
                            type=_non_negative_int)

    @property
    def algorithm(self) -> Algorithm:
        """The algorithm -m selects (with -dcasgd, --balance-batches): its registry row,
        which every layer reads rather than resolving the mode itself."""
        return of_options(self)



def _algorithms_flags() -> list:
    """The flags that algorithms declare on their policies' fields (esync.flagtypes.flag:
    ESync's --max-local-steps, local SGD's --period), each once (-gl is ESync's and local
    SGD's), in the registry's order: an algorithm's unit brings its own flags, and no
    line here names them."""
    known = {f.name for f in fields(_MainFlags)}
    declared = []
    for algorithm in ALGORITHMS.values():
        policy = algorithm.policy_class()
        types = typing.get_type_hints(policy)
        for f in fields(policy):
            name = policy.FLAGS.get(f.name, f.name)  # DC-ASGD's lamda: --dcasgd-lamda
            if "args" in f.metadata and name not in known:
                known.add(name)
                declared.append((name, types[f.name],
                                 dataclasses.field(default=f.default, metadata=f.metadata)))
    return declared


#: Settings of one process of a run (worker, server, scheduler or standalone): main.py's
#: flags, then those the algorithms' policies declare
Options = make_dataclass("Options", _algorithms_flags(), bases=(_MainFlags,))
Options.__module__ = __name__
Options.__doc__ = _MainFlags.__doc__

#: the settings (Options field names) that only main.py's built-in loop (esync/runtime/train.py,
#: esync/runtime/task.py, esync/runtime/worker.py) reads: a script's own optimizer and DataLoader take
#: their place (-ll is ESync's local SGD step, -b the built-in loader's batch, which a
#: script's DataLoader gives, speed-balanced DDP's global batch included,
#: --loader-workers the built-in DataLoader's workers). Not -l: a script's SSGD/ASGD step
#: is pushed as the gradient (w_start - w) / lr with -l as lr, which DC-ASGD's
#: compensation and --compress threshold:T read. esync-run's help marks them.
BUILT_IN_LOOP_ONLY = frozenset({"local_lr", "momentum", "weight_decay", "batch_size",
                                "loader_workers"})


class _OneLineParser(ArgumentParser):
    """argparse prints usage plus an error and exits; we raise the one line naming the
    flag as a UserError, which esync.cli prints (and reports to the scheduler)."""

    def error(self, message: str):
        raise UserError(message)


def build_parser(prog: str = "esync") -> ArgumentParser:
    return _OneLineParser(
        Options, prog=prog,
        description="Train a network with ESync, SSGD, ASGD, DC-ASGD, local SGD, DDP or "
                    "standalone. "
                    "The role (scheduler, server, worker, evaluator) comes from DMLC_ROLE; "
                    "-m ddp takes torch.distributed's RANK, WORLD_SIZE, MASTER_ADDR and "
                    "MASTER_PORT; without either only -m local runs.")


def flags_given(argv: Sequence[str], prog: str = "esync") -> Set[str]:
    """The settings (Options field names) that `argv` sets itself, as opposed to those
    left to their defaults; `argv` is checked as parse_options checks it."""
    parser = build_parser(prog)
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    namespace, _ = argparse.ArgumentParser.parse_known_args(parser, list(argv))
    return set(vars(namespace))


def parse_options(argv: Optional[Sequence[str]] = None, prog: str = "esync") -> Options:
    """Parse the command line; a bad value raises UserError naming the flag."""
    return build_parser(prog).parse_args(list(sys.argv[1:] if argv is None else argv))
