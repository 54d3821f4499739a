"""Every network of the original (and lenet) runs forward and backward on a tiny batch."""
import pytest
import torch
import torch.nn.functional as F

from esync.models import NETWORKS, build_network

INPUT_SIZES = {"alexnet": 224, "inception-v3": 299}


def test_all_original_networks_present():
    assert {"alexnet", "resnet18-v1", "resnet50-v1", "resnet50-v2", "mobilenet-v1",
            "mobilenet-v2", "inception-v3", "lenet"} <= set(NETWORKS)


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_forward_backward(name):
    torch.manual_seed(0)
    model = build_network(name)
    assert model.input_size == INPUT_SIZES.get(name, 28)
    images, labels = torch.randn(2, 1, 28, 28), torch.tensor([3, 8])
    logits = model(images)
    assert logits.shape == (2, 10)
    F.cross_entropy(logits, labels).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum().item() for g in grads) > 0


def test_resnet18_has_the_papers_size():
    """44.7 MB of float32 weights, the model size the benchmarks use."""
    n = sum(p.numel() for p in build_network("resnet18-v1").parameters())
    assert round(n * 4 / 1e6, 1) == 44.7
