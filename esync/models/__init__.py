"""The networks, by the names the original ESync's `-n` flag used (plus `lenet`).

Importing this package is cheap (no torch): the command-line parser reads the names
here, and a network's module is imported only when one is built.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Dict

if TYPE_CHECKING:
    from esync.models.base import Classifier

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


def build_network(name: str, num_classes: int = 10) -> "Classifier":
    """A freshly initialised network; `name` is one of NETWORKS."""
    module, _, builder = NETWORKS[name].partition(":")
    return getattr(importlib.import_module(module), builder)(num_classes)
