"""The networks, by the names the original ESync's `-n` flag used (plus `lenet`)."""
from __future__ import annotations

from typing import Callable

from esync.models.alexnet import alexnet
from esync.models.base import Classifier
from esync.models.inception import inception_v3
from esync.models.lenet import lenet
from esync.models.mobilenet import mobilenet_v1, mobilenet_v2
from esync.models.resnet import resnet18_v1, resnet50_v1, resnet50_v2

NETWORKS: dict[str, Callable[[int], Classifier]] = {
    "lenet": lenet,
    "alexnet": alexnet,
    "resnet18-v1": resnet18_v1,
    "resnet50-v1": resnet50_v1,
    "resnet50-v2": resnet50_v2,
    "mobilenet-v1": mobilenet_v1,
    "mobilenet-v2": mobilenet_v2,
    "inception-v3": inception_v3,
}


def build_network(name: str, num_classes: int = 10) -> Classifier:
    """A freshly initialised network; `name` is one of NETWORKS."""
    return NETWORKS[name](num_classes)
