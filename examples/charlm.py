"""Byte-level transformer language model on the Python standard library's source.

A workload that needs no download: every Python install ships its standard
library as ``.py`` files, so the corpus is always there.  The builders below
are meant to be imported as plug-ins (``examples.charlm:build_model`` and so
on); ``examples/charlm_plain.py`` trains them with a plain PyTorch loop.

The corpus is deterministic for a given Python install (files are read in
sorted order), but differs between Python versions, so losses are comparable
only on the same interpreter.
"""

from __future__ import annotations

import math
import os
import sysconfig

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

#: Number of bytes the model sees at once (and predicts at once).
CONTEXT = 64
#: Vocabulary: one token per byte value.
VOCAB = 256
#: At most this many bytes of source are read (whole files, in sorted order).
MAX_BYTES = 4_000_000
#: Number of fixed validation windows; one evaluation is one pass over them.
VAL_WINDOWS = 512
#: Directories not read: installed packages, caches, and the test suites
#: (large, repetitive, and not what "library code" looks like).
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"})


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a GELU MLP."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        # [b, t, d] -> [b, heads, t, d / heads]
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class CharLM(nn.Module):
    """Decoder-only transformer over bytes: token + learned position embedding,
    ``n_layers`` causal blocks, final LayerNorm, and a head tied to the token
    embedding (fewer parameters, which helps a model this small)."""

    def __init__(self, d_model: int = 64, n_layers: int = 2, n_heads: int = 4, context: int = CONTEXT) -> None:
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB, bias=False)
        self.head.weight = self.tok.weight
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                # GPT-2 style: small normal init; residual projections scaled by depth.
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """``idx``: int64 [batch, t] with t <= context; returns logits [batch, t, 256]."""
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build_model() -> nn.Module:
    """The tuned default: 2 layers, d_model 64, 4 heads, context ``CONTEXT``
    (about 0.12 M parameters).  On one CPU core this size learns fastest per
    second: d_model 128 or more layers do better per step but take 2-3x longer
    a step, and lose within a one-minute budget."""
    return CharLM()


class ByteWindows(Dataset):
    """(input, target) pairs of int64 tensors of length ``context`` cut from a
    byte tensor at the given start offsets; target is input shifted by one."""

    def __init__(self, data: torch.Tensor, starts: list[int], context: int = CONTEXT) -> None:
        assert all(0 <= s and s + context + 1 <= len(data) for s in starts)
        self.data, self.starts, self.context = data, starts, context

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.starts[i]
        chunk = self.data[s : s + self.context + 1].long()
        return chunk[:-1], chunk[1:]


def read_stdlib_bytes(max_bytes: int = MAX_BYTES) -> bytes:
    """Concatenated bytes of the standard library's ``.py`` files, walked in
    sorted order (skipping ``SKIP_DIRS``), whole files until ``max_bytes`` is
    reached, then truncated to exactly ``max_bytes`` if the corpus is larger."""
    root = sysconfig.get_paths()["stdlib"]
    parts, total = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(dirpath, name), "rb") as f:
                parts.append(f.read())
            total += len(parts[-1])
            if total >= max_bytes:
                return b"".join(parts)[:max_bytes]
    return b"".join(parts)


def build_data() -> tuple[Dataset, Dataset]:
    """(train, validation) datasets over the standard library's source.

    The first 90% of the bytes are training data, cut into non-overlapping
    windows every ``CONTEXT`` bytes; the last 10% give ``VAL_WINDOWS`` windows
    at evenly spaced offsets, so that one evaluation is cheap and always the same.
    """
    data = torch.frombuffer(bytearray(read_stdlib_bytes()), dtype=torch.uint8)
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]
    train_starts = list(range(0, len(train) - CONTEXT, CONTEXT))
    last = len(val) - CONTEXT - 1
    val_starts = [i * last // (VAL_WINDOWS - 1) for i in range(VAL_WINDOWS)]
    return ByteWindows(train, train_starts, CONTEXT), ByteWindows(val, val_starts, CONTEXT)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats per byte) over every position of every window."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
