"""The networks, by the names the original ESync's `-n` flag used (plus `lenet`), and
the user's own as plug-ins: `-n mypackage.nets:build` (esync.infra.plugin) trains whatever
torch.nn.Module `build()` returns, once it maps the data set's inputs to one score per
class.

Importing this package is cheap (no torch): the command-line parser reads the names
here, and a network's module is imported only when one is built.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Dict, Optional

from esync.infra import plugin
from esync.errors import UserError

if TYPE_CHECKING:
    import torch
    from torch import nn

FLAG = "-n/--network"

#: `-n` name -> module:function building it (its one argument: the number of classes)
NETWORKS: Dict[str, str] = {
    "lenet": "esync.models.lenet:lenet",
    "alexnet": "esync.models.alexnet:alexnet",
    "resnet18-v1": "esync.models.resnet:resnet18_v1",
    "resnet50-v1": "esync.models.resnet:resnet50_v1",
    "resnet50-v2": "esync.models.resnet:resnet50_v2",
    "mobilenet-v1": "esync.models.mobilenet:mobilenet_v1",
    "mobilenet-v2": "esync.models.mobilenet:mobilenet_v2",
    "inception-v3": "esync.models.inception:inception_v3",
}


def build_network(name: str, num_classes: int = 10,
                  sample: Optional["torch.Tensor"] = None) -> "nn.Module":
    """A freshly initialised network: `name` is one of NETWORKS (built for
    `num_classes`), or a plug-in's `module:function`, which must return a
    torch.nn.Module: called without arguments, or with `num_classes=` (the data set's)
    if it has a parameter of that name. A plug-in is checked on `sample` (a few of the
    data set's inputs), when given, with check_output. UserError, one line, otherwise."""
    if name in NETWORKS:
        module, _, builder = NETWORKS[name].partition(":")
        return getattr(importlib.import_module(module), builder)(num_classes)
    from torch import nn

    model = plugin.call(name, FLAG, **(
        {"num_classes": num_classes} if plugin.takes(name, FLAG, "num_classes") else {}))
    if not isinstance(model, nn.Module):
        raise UserError(f"{FLAG} {name}: returned a {type(model).__name__}, not a "
                        f"torch.nn.Module")
    if sample is not None:
        check_output(model, name, sample, num_classes)
    return model


def run_on(model: "nn.Module", name: str, inputs, what: str):
    """The model's output for `inputs` (`what` they are, for the error), in evaluation
    mode and without gradients, the model left as it was; UserError, one line naming
    -n, if it fails."""
    import torch

    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return model(inputs)
    except Exception as e:
        raise UserError(f"{FLAG} {name}: the network fails on {what}: "
                        f"{plugin.describe(e)}") from None
    finally:
        model.train(training)


def check_output(model: "nn.Module", name: str, images: "torch.Tensor",
                 num_classes: int) -> None:
    """UserError (one line naming -n) unless the network maps `images`, a few of the
    data set's samples, to one score per class each: a plug-in written for other data
    is refused before it trains. The model is left as it was (evaluation mode for the
    check, no gradient, BatchNorm's statistics untouched)."""
    import torch

    out = run_on(model, name, images, f"the data set's samples (shape {list(images.shape)})")
    wanted = [len(images), num_classes]
    if not isinstance(out, torch.Tensor) or list(out.shape) != wanted:
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise UserError(f"{FLAG} {name}: the network's output for {len(images)} samples "
                        f"is {got}, expected {wanted} (one score per class)")
