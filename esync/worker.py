"""Builds one training process (data partition, network, logs) and runs the training loop."""
from __future__ import annotations

import socket

import torch

from esync.algorithms import Algorithm
from esync.data import BatchStream, EpochOrder, load_dataset, partition
from esync.errors import UserError
from esync.models import build_network
from esync.options import Options
from esync.recorder import Recorder
from esync.train import StopCriteria, TrainResult, train


def select_device(opts: Options) -> torch.device:
    """cpu, or cuda:N for `-g N` (an error if there is no such GPU)."""
    if opts.cpu or opts.gpu is None:
        return torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if opts.gpu >= count:
        found = f"{count} CUDA device{'s' if count != 1 else ''}" if count else "no CUDA device"
        raise UserError(f"-g/--gpu {opts.gpu}: this machine has {found}; "
                        f"leave out -g (or pass -c 1) to train on the CPU")
    return torch.device(f"cuda:{opts.gpu}")


def device_label(opts: Options, device: torch.device) -> str:
    if opts.device_name:
        return opts.device_name
    return "cpu" if device.type == "cpu" else f"gpu{device.index}"


def stop_criteria(opts: Options) -> StopCriteria:
    return StopCriteria(opts.epochs, opts.max_rounds, opts.time_limit, opts.target_accuracy)


def run_worker(opts: Options, algorithm: Algorithm, rank: int = 0,
               num_workers: int = 1) -> TrainResult:
    """Train partition `rank` of `num_workers` with `algorithm` until a stop criterion."""
    device = select_device(opts)
    if opts.num_threads:
        torch.set_num_threads(opts.num_threads)
    torch.manual_seed(opts.seed)
    dataset = load_dataset(opts.dataset, opts.data_dir)
    try:
        indices = partition(dataset.train_labels.numpy(), num_workers, rank,
                            opts.split_by_class, opts.seed)
    except ValueError as e:
        raise UserError(f"--dataset {opts.dataset}: {e}") from None
    order = EpochOrder(indices, opts.shuffle, seed=[opts.seed, rank],
                       block_size=opts.block_size, buffer_ratio=opts.buffer_ratio)
    batches = BatchStream(dataset, order, opts.batch_size, device)
    model = build_network(opts.network).to(device)
    stop = stop_criteria(opts)
    with Recorder(opts.log_dir, socket.gethostname(), device_label(opts, device)) as recorder:
        print(f"[{algorithm.name}] training {opts.network} on {opts.dataset} "
              f"({len(indices)} samples, rank {rank} of {num_workers}) on {device}; "
              f"logs in {recorder.path}", flush=True)
        if not any(vars(stop).values()):
            print(f"[{algorithm.name}] no stop criterion given (--epochs, --max-rounds, "
                  f"--time-limit, --target-accuracy): training until interrupted", flush=True)
        return train(model, algorithm, batches, dataset, recorder, stop,
                     device, opts.slowdown, log=lambda line: print(line, flush=True))
