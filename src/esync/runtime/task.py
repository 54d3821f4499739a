"""What main.py trains and how it measures it, from its flags: the data (--dataset,
--data-dir), the network (-n), the loss (--loss), the evaluation metric (--metric) and
the evaluation itself (--evaluate).

The built-in data sets are in-memory arrays (esync.data.datasets) streamed in batches
of any size the algorithm asks for; every other data set (a plug-in's
`module:function`, an image folder, CIFAR-10's binary batches) is a pair of torch
Datasets, fed to the loop by the public API's prepare_data_loader as a user's script
would be. Either way the same loop trains it (esync.runtime.train) and the same `evaluate`
measures it, in a worker or in the evaluator.

A sample of a torch Dataset is, by default, a pair (input, target) or a tuple (inputs...,
target): the network is run as `model(*inputs)`, and the metric is top-1 accuracy or
the loss's mean on the test set. With `--evaluate module:function` the samples may
have any form (dicts, several tensors, ...): the user's function measures the model on
the test set (`Task.evaluate` calls it, in a worker, alone or in the evaluator).

Before anything starts (`check`), the network is built and run on two training
samples, and the loss computed on its output, so that a plug-in written for other data
is refused with one line naming the flag; with `--evaluate` the user's function is
called on two test samples instead (and as well, where the samples are pairs).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from esync.infra import plugin
from esync.data import ON_DISK, SHARDS_PREFIX
from esync.data.order import labels_of
from esync.data.datasets import Dataset as Arrays, load_dataset
from esync.errors import UserError
from esync.models import build_network, run_on

EVAL_BATCH = 512
CHECK_SAMPLES = 2  # samples a check runs the network or the --evaluate function on
DATASET_FLAG, LOSS_FLAG, EVALUATE_FLAG = "--dataset", "--loss", "--evaluate"

#: `--evaluate module:function`: (model, test_set, device) -> the metric, a number
Evaluation = Callable[[nn.Module, Any, torch.device], Any]

@dataclass
class Task:
    """A data set (in memory, or a torch training and test set), its loss and metric."""

    dataset: str
    arrays: Optional[Arrays]           # a built-in data set, in memory
    train_set: Any = None              # torch Datasets otherwise
    test_set: Any = None
    loss: Callable[..., torch.Tensor] = F.cross_entropy
    metric: str = "accuracy"
    evaluation: Optional[Evaluation] = None  # --evaluate's function
    evaluation_spec: Optional[str] = None    # its module:function, for the errors
    _arrays_test: Any = field(default=None, init=False, repr=False)

    @property
    def num_classes(self) -> int:
        """The classes a built-in network is built for (10 where the data do not say)."""
        if self.arrays is not None:
            return self.arrays.num_classes
        classes = getattr(self.train_set, "classes", None)
        if classes is not None:
            return len(classes)
        targets = getattr(self.train_set, "targets", None)
        return int(max(targets)) + 1 if targets is not None and len(targets) else 10

    def labels(self):
        """One label per training sample, for the partitions (-s 1 splits by class)."""
        if self.arrays is not None:
            return self.arrays.train_labels.numpy()
        return labels_of(self.train_set)

    def sample(self, n: int = 2) -> Tuple[Any, Any]:
        """The first `n` training samples as one batch (inputs, targets)."""
        if self.arrays is not None:
            return self.arrays.sample(n), self.arrays.train_labels[:n]
        return next(iter(DataLoader(self.train_set, batch_size=n)))

    def build_model(self, network: str) -> nn.Module:
        return build_network(network, self.num_classes)

    def test_data(self) -> Any:
        """The test set as a torch Dataset, as `--evaluate`'s function is given it: a
        plug-in's or a folder's own; a built-in data set's normalised images and labels,
        as (image, label) pairs."""
        if self.arrays is None:
            return self.test_set
        if self._arrays_test is None:
            data = self.arrays
            self._arrays_test = TensorDataset(data.normalize(data.test_images),
                                              data.test_labels)
        return self._arrays_test

    def check(self, network: str) -> nn.Module:
        """The network, built; UserError (one line naming -n or --loss) unless it runs
        on two training samples and the loss of its output is a number, and (one line
        naming --evaluate) unless `--evaluate`'s function, given two test samples,
        returns a finite number. With `--evaluate`, samples that are not pairs are not
        run through the network here: the function's check does."""
        model = build_network(network, self.num_classes, *(
            [self.arrays.sample()] if self.arrays is not None else []))
        if self.arrays is None or self.loss is not F.cross_entropy:
            # a built-in data set with cross_entropy: checked by build_network already
            self._check_forward(model, network)
        if self.evaluation is not None:
            self._check_evaluation(model)
        return model

    def _check_forward(self, model: nn.Module, network: str) -> None:
        """UserError unless the network runs on two training samples and the loss of
        its output is a number (skipped, with --evaluate, for samples not pairs)."""
        if self.arrays is not None:
            inputs = (self.arrays.sample(CHECK_SAMPLES),)
            targets = self.arrays.train_labels[:CHECK_SAMPLES]
        else:
            if self.evaluation is not None and not _pair(self.train_set[0]):
                return
            batch = next(iter(DataLoader(self.train_set, batch_size=CHECK_SAMPLES)))
            inputs, targets = _split(batch)
        out = _forward(model, network, inputs, f"two samples of --dataset {self.dataset}")
        try:
            value = self.loss(out, targets)
            value = float(value)
        except Exception as e:
            raise UserError(f"{LOSS_FLAG}: the loss of the network's output "
                            f"({_shape(out)}) and the targets ({_shape(targets)}) fails: "
                            f"{plugin.describe(e)}") from None
        if not math.isfinite(value):
            raise UserError(f"{LOSS_FLAG}: the loss of two samples is {value}, not a number")

    def _check_evaluation(self, model: nn.Module) -> None:
        """UserError (one line naming --evaluate) unless the function, given the model
        on the CPU and two test samples, returns a finite number."""
        test_set = self.test_data()
        few = Subset(test_set, range(min(CHECK_SAMPLES, len(test_set))))
        value = self._measure(model, few, torch.device("cpu"))
        if not math.isfinite(value):
            raise UserError(f"{EVALUATE_FLAG} {self.evaluation_spec}: on {len(few)} test "
                            f"samples it returned {value}, not a finite number")

    def pairs(self) -> Any:
        """The training set for main.py's loop, which trains (input, target) pairs;
        UserError, naming --dataset, for samples of another form."""
        first = self.train_set[0]
        if not _pair(first):
            raise UserError(f"{DATASET_FLAG} {self.dataset}: main.py's loop trains (input, "
                            f"target) pairs, not samples that are a {_kind(first)}: "
                            f"train them with a script of your own (esync-run SCRIPT.py)")
        return self.train_set

    def evaluate(self, model: nn.Module, device: torch.device) -> float:
        """The metric of `model` (on `device`) on the whole test set: `--evaluate`'s
        function's, or else top-1 accuracy or the loss's mean over (inputs..., target)
        samples. Measured in evaluation mode without gradients; the model is left in
        the mode it was in. A function that raises or returns no number: UserError
        naming --evaluate."""
        if self.evaluation is not None:
            return self._measure(model, self.test_data(), device)
        training = model.training
        model.eval()
        total, count = 0.0, 0
        try:
            with torch.no_grad():
                for inputs, targets in self._test_batches(device):
                    out = model(*inputs)
                    if self.metric == "accuracy":
                        total += (out.argmax(-1) == targets).sum().item()
                        count += targets.numel()
                    else:
                        total += self.loss(out, targets).item() * len(targets)
                        count += len(targets)
        finally:
            model.train(training)
        return total / max(1, count)

    def _measure(self, model: nn.Module, test_set: Any, device: torch.device) -> float:
        """`--evaluate`'s function on `test_set`, the model in evaluation mode and
        gradients off, the model's mode restored after; its value as a float."""
        training = model.training
        model.eval()
        try:
            with torch.no_grad():
                value = plugin.invoke(self.evaluation, self.evaluation_spec, EVALUATE_FLAG,
                                      model, test_set, device)
        finally:
            model.train(training)
        number = _number(value)
        if number is None:
            raise UserError(f"{EVALUATE_FLAG} {self.evaluation_spec}: returned a "
                            f"{type(value).__name__}, not a number (the metric of the "
                            f"model on the test set)")
        return number

    def _test_batches(self, device: torch.device) -> Iterator[Tuple[tuple, Any]]:
        """(the model's positional inputs, the targets) of the test set, batch by
        batch, on `device`."""
        if self.arrays is not None:
            data = self.arrays
            for start in range(0, len(data.test_labels), EVAL_BATCH):
                part = slice(start, start + EVAL_BATCH)
                yield ((data.normalize(data.test_images[part]).to(device),),
                       data.test_labels[part].to(device))
            return
        for batch in DataLoader(self.test_set, batch_size=EVAL_BATCH):
            inputs, targets = _split(batch)
            yield tuple(x.to(device) for x in inputs), targets.to(device)


def _shape(x: Any) -> str:
    return f"shape {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def _default_form(sample: Any) -> bool:
    """Whether a sample (or a collated batch) is (input, target) or (inputs..., target)."""
    return isinstance(sample, (tuple, list)) and len(sample) >= 2


def _pair(sample: Any) -> bool:
    """Whether a sample is (input, target)."""
    return _default_form(sample) and len(sample) == 2


def _kind(sample: Any) -> str:
    """What a sample is, for an error: `dict`, `tuple of 1`."""
    name = type(sample).__name__
    return f"{name} of {len(sample)}" if isinstance(sample, (tuple, list)) else name


def _split(batch: Any) -> Tuple[tuple, Any]:
    """A batch of the default form: (the model's positional inputs, the targets)."""
    return tuple(batch[:-1]), batch[-1]


class _Positional(nn.Module):
    """A model of several inputs as one of a single tuple (what run_on runs)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, inputs: tuple) -> Any:
        return self.model(*inputs)


def _forward(model: nn.Module, network: str, inputs: tuple, what: str) -> Any:
    """`model(*inputs)` as run_on runs it (evaluation mode, no gradients, UserError
    naming -n)."""
    if len(inputs) == 1:
        return run_on(model, network, inputs[0], what)
    return run_on(_Positional(model).train(model.training), network, inputs, what)


def _number(value: Any) -> Optional[float]:
    """`value` as a float if it is a real number (a Python or numpy one, or a tensor
    of one element), else None: a bool or a string is not a metric."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype == torch.bool or value.is_complex():
            return None
        return float(value.item())
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return None


_LOADED: Dict[tuple, Task] = {}


def load_task(dataset: str, data_dir: str, loss: str = "cross_entropy",
              metric: str = "accuracy", evaluate: Optional[str] = None) -> Task:
    """The task the flags name (loaded once per process: `check` and training share it).
    `evaluate`: --evaluate's module:function, or None."""
    key = (dataset, data_dir, loss, metric, evaluate)
    if key not in _LOADED:
        _LOADED[key] = _load(*key)
    return _LOADED[key]


def task_of(opts: Any) -> Task:
    """The task an Options names (--dataset, --data-dir, --loss, --metric, --evaluate)."""
    return load_task(opts.dataset, opts.data_dir, opts.loss, opts.metric, opts.evaluate)


def _load(dataset: str, data_dir: str, loss: str, metric: str,
          evaluate: Optional[str]) -> Task:
    loss_fn = F.cross_entropy if loss == "cross_entropy" else plugin.load(loss, LOSS_FLAG)
    evaluation = plugin.load(evaluate, EVALUATE_FLAG) if evaluate else None
    measured = dict(loss=loss_fn, metric=metric, evaluation=evaluation,
                    evaluation_spec=evaluate)
    if dataset.startswith(SHARDS_PREFIX):
        from esync.data.decode import ShardDataset

        folder = dataset[len(SHARDS_PREFIX):]
        pair = ShardDataset(folder, "train"), ShardDataset(folder, "test")
    elif plugin.is_spec(dataset):
        pair = plugin.call(dataset, DATASET_FLAG)
    elif dataset in ON_DISK:
        from esync.data import formats

        pair = formats.image_folder(data_dir) if dataset == "folder" else \
            formats.cifar10_binary(data_dir)
    else:
        return Task(dataset, load_dataset(dataset, data_dir), **measured)
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise UserError(f"{DATASET_FLAG} {dataset}: returned a {type(pair).__name__}, not "
                        f"a pair (training set, test set)")
    for name, part in zip(("training", "test"), pair):
        if not (hasattr(part, "__getitem__") and hasattr(part, "__len__")):
            raise UserError(f"{DATASET_FLAG} {dataset}: its {name} set is a "
                            f"{type(part).__name__}, not a torch Dataset")
        if len(part) == 0:
            raise UserError(f"{DATASET_FLAG} {dataset}: its {name} set is empty")
    first = pair[0][0]
    if evaluation is None and not _default_form(first):
        raise UserError(f"{DATASET_FLAG} {dataset}: a training sample is a {_kind(first)}, "
                        f"not a pair (input, target) nor a tuple (inputs..., target): give "
                        f"{EVALUATE_FLAG} module:function to measure samples of another "
                        f"form")
    return Task(dataset, None, pair[0], pair[1], **measured)
