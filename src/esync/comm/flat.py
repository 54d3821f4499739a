"""A model's parameters and buffers as views of two flat float32 vectors.

The servers hold contiguous shards of these vectors, so a push or pull is one message
per server. The model's own tensors become views of the vectors: writing pulled weights
into the vector updates the model with no further copy.
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np
import torch
from torch import nn


def _flatten_into(tensors: List[torch.Tensor], device: torch.device) -> Tuple[torch.Tensor, List[Tuple[int, int]]]:
    spans, offset = [], 0
    for t in tensors:
        spans.append((offset, t.numel()))
        offset += t.numel()
    flat = torch.empty(offset, dtype=torch.float32, device=device)
    for t, (start, n) in zip(tensors, spans):
        flat[start:start + n].copy_(t.detach().reshape(-1))
    return flat, spans


def trainable(model: nn.Module) -> List[torch.Tensor]:
    """The weights a push or pull carries, in the order of the flat `params` vector."""
    return [p for p in model.parameters() if p.requires_grad]


def floating_buffers(model: nn.Module) -> List[Tuple[nn.Module, str, torch.Tensor]]:
    """(module, name, buffer) of the floating buffers, in the order of `buffers`."""
    return [(m, name, b) for m in model.modules() for name, b in m._buffers.items()
            if b is not None and b.is_floating_point()]


class FlatModel:
    """`params` (trainable weights) and `buffers` (floating buffers: BatchNorm statistics)
    are flat float32 tensors on the model's device; `host_*` are numpy views of CPU copies
    (the same memory on a CPU device). Integer buffers (BatchNorm's batch counter) stay
    local: they do not affect training with a fixed BatchNorm momentum."""

    def __init__(self, model: nn.Module, device: torch.device):
        self.device = device
        params = trainable(model)
        self.params, spans = _flatten_into([p.data for p in params], device)
        for p, (start, n) in zip(params, spans):
            p.data = self.params[start:start + n].view_as(p)
        owners = floating_buffers(model)
        self.buffers, spans = _flatten_into([b for _, _, b in owners], device)
        for (module, name, b), (start, n) in zip(owners, spans):
            module._buffers[name] = self.buffers[start:start + n].view_as(b)
        self.grads = torch.zeros_like(self.params)  # what a round pushes (its step)
        on_cpu = device.type == "cpu"
        self._host = {name: (t if on_cpu else torch.empty(t.numel(), dtype=torch.float32,
                                                            pin_memory=True))
                      for name, t in (("params", self.params), ("buffers", self.buffers),
                                      ("grads", self.grads))}

    def host(self, name: str) -> np.ndarray:
        """numpy view of the CPU copy of `params`, `buffers` or `grads`."""
        return self._host[name].numpy()

    def host_state(self) -> Tuple[np.ndarray, np.ndarray]:
        """Current weights and buffers as host vectors."""
        return self.to_host("params"), self.to_host("buffers")

    def to_host(self, name: str) -> np.ndarray:
        """`params`, `buffers` or `grads` copied to the host (no copy on a CPU device)."""
        if self.device.type != "cpu":
            self._host[name].copy_(getattr(self, name))
        return self.host(name)

    def load_host_state(self) -> None:
        """After new weights and buffers were written into the host vectors."""
        if self.device.type != "cpu":
            self.params.copy_(self._host["params"], non_blocking=False)
            self.buffers.copy_(self._host["buffers"], non_blocking=False)
