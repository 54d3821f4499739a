"""Partial synchronisation (`--compress partial:K`) on the worker, for SSGD and ESync on
either backend: each round one slice of the weights vector is synchronised, in
round-robin (esync.comm.compress.Compression.window), the others staying local, as Apache
SINGA's `backward_and_partial_update`.

The worker keeps `reference`, the weights each slice had when it was last synchronised
(the servers hold the same values there: nobody else changes a slice between its
synchronisations), and the local steps run since. For the round's slice it pushes its
change since then, as the mode pushes a round's change (SSGD: read as a gradient, the
sum of the steps; ESync: the delta, weighed by those steps with `--average steps`), so
that the rule makes the slice the workers' average, exactly as if the slice alone had
run K rounds of local SGD. Everything outside the slice is zero in the push (a zero
gradient or delta moves nothing: partial refuses `--outer-momentum`) and is not sent
(the servers get empty `slice` chunks; the all-reduce reduces the slice only); after the
round the worker keeps its own values there.
"""
from __future__ import annotations

from typing import Tuple

import torch

from esync.comm.compress import Compression


class PartialSync:
    def __init__(self, compression: Compression, params: torch.Tensor):
        self.compression = compression
        self.reference = params.detach().clone()
        self.local = torch.empty_like(self.reference)  # the weights kept through a pull
        self.steps = [0] * compression.slices  # local steps since each slice's last sync
        self.window: Tuple[int, int] = (0, len(params))

    def begin(self, round_: int, steps: int) -> int:
        """Round `round_`'s slice, after `steps` local steps in it; returns the local
        steps since the slice was last synchronised."""
        self.window = self.compression.window(round_, len(self.reference))
        self.steps = [s + steps for s in self.steps]
        k = self.compression.slice_of(round_)
        since, self.steps[k] = self.steps[k], 0
        return since

    def change(self, params: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """`out`: the slice's change since its last synchronisation, zero elsewhere."""
        lo, hi = self.window
        out.zero_()
        torch.sub(params[lo:hi], self.reference[lo:hi], out=out[lo:hi])
        return out

    def rewind(self, params: torch.Tensor) -> None:
        """All-reduce: the slice goes back to its last synchronised values (the rule
        moves it from there), the rest stays local."""
        lo, hi = self.window
        params[lo:hi].copy_(self.reference[lo:hi])

    def keep_local(self, params: torch.Tensor) -> None:
        """Parameter servers: before the pull overwrites `params`."""
        self.local.copy_(params)

    def synchronised(self, params: torch.Tensor, pulled: bool) -> None:
        """After the round's aggregation: outside the slice the local weights again
        (`pulled`: the servers' answer overwrote them), the slice the new reference."""
        lo, hi = self.window
        if pulled:
            params[:lo].copy_(self.local[:lo])
            params[hi:].copy_(self.local[hi:])
        self.reference[lo:hi].copy_(params[lo:hi])
