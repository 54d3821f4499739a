"""SINGA's codecs in whole jobs (issue 29): `--compress partial:K`, `threshold:T` and
`topk:R` on both backends (top-k through the servers: tests/test_allreduce.py), and
`threshold:auto:F` (about F of the values every round), each training lenet on digits
to 0.90 with 2 workers through the launcher.

Every round of every worker sends exactly what the codec's arithmetic says, checked
against the worker's own log (`bytes_sent`; the servers' pushes counted on the wire,
the all-reduce's by the ring's estimate):
- through the servers: 4 bytes per value of the round's slice (partial) or 8 per value
  sent (int32 index, float32 value), plus the buffers' float32 and the headers;
- all-reduce: the control vector's ring all-reduce (buffers, under ESync's average by
  steps twice, a stop flag per worker, the samples, the steps, and for the sparse codecs
  two count parts per worker), plus the slice's
  ring all-reduce (partial) or the ring all-gather of the most any worker sent that
  round, padded (sparse).
A partial job synchronises every slice within K rounds: each worker's logged slices of
any K consecutive rounds tile the weights, and the bytes it sent are that slice's.
(The servers' side of partial pushes, weight by weight:
tests/test_aggregation_options.py.)
"""
import glob
import json
import math
import os

import pytest

from esync.comm.compress import Compression
from tests.helpers import evaluator_accuracy
from tests.test_allreduce import HEADERS, LENET_BUFFERS, LENET_WEIGHTS, launch

pytestmark = pytest.mark.slow  # whole jobs of real processes

WORKERS = 2


def rounds_by_worker(out, mode):
    """{worker folder: [its round records, by round]}."""
    found = {}
    for folder in glob.glob(os.path.join(out, "lenet", mode, "*", "w*")):
        paths = glob.glob(os.path.join(folder, "iter-*.json"))
        paths.sort(key=lambda p: int(os.path.basename(p)[5:-5]))
        found[os.path.basename(folder)] = [json.load(open(p)) for p in paths]
    assert len(found) == WORKERS, found.keys()
    return found


def ring(nbytes):
    return int(2 * (WORKERS - 1) * nbytes / WORKERS)


@pytest.mark.parametrize("mode, backend, codec", [
    ("sync", "ps", "partial:4"), ("esync", "allreduce", "partial:4"),
    ("esync", "ps", "threshold:0.01"), ("sync", "allreduce", "threshold:0.05"),
    ("esync", "allreduce", "topk:0.01"), ("sync", "ps", "threshold:auto:0.01")])
def test_a_codec_trains_to_90_percent_sending_what_it_says(tmp_path, mode, backend, codec):
    args = ["-m", mode, "--backend", backend, "--workers", str(WORKERS),
            "--compress", codec]
    if mode == "esync":
        # at most 8 local steps a round: with the open round the fast device ran up to
        # 64, and the job reached 0.90 within 4 rounds under CI's load, too few to see
        # K=4 slices tile the weights
        args += ["--slowdown", "1,2", "--max-local-steps", "8"]
    code, output = launch(tmp_path, args)
    assert code == 0, output[-2000:]
    assert evaluator_accuracy(tmp_path, mode) >= 0.90
    compression = Compression.parse(codec)
    workers = rounds_by_worker(tmp_path, mode)
    rounds = {len(records) for records in workers.values()}
    assert len(rounds) == 1 and rounds.pop() > compression.slices, rounds
    # the buffers (ESync averaging by steps, its default: also times the steps), each
    # worker's stop flag, sparse count (2) and steps, the samples
    control = LENET_BUFFERS * (2 if mode == "esync" else 1) + 2 * WORKERS + 1 + \
        (2 * WORKERS if compression.sparse else 0)
    for name, records in workers.items():
        for round_, record in enumerate(records, 1):
            sent = record["bytes_sent"]
            if compression.kind == "partial":
                lo, hi = record["synced"]
                assert (lo, hi) == compression.window(round_, LENET_WEIGHTS)
                data = 4 * (hi - lo)
            else:
                values = record["pushed_values"]
                assert 0 <= values <= LENET_WEIGHTS
                if compression.kind == "topk":
                    assert values == math.ceil(0.01 * LENET_WEIGHTS)
                if backend == "allreduce":  # padded to the most any worker sent
                    values = max(w[round_ - 1]["pushed_values"] for w in workers.values())
                data = 8 * values
            where = (name, round_, record)
            if backend == "ps":
                assert data + 4 * LENET_BUFFERS < sent < data + 4 * LENET_BUFFERS + HEADERS, \
                    where
            elif compression.kind == "partial":
                assert sent == ring(4 * control) + ring(data), where
            else:  # a ring all-gather of 8 * values from each worker
                assert sent == ring(4 * control) + (WORKERS - 1) * data, where
        if compression.kind == "partial":  # any K consecutive rounds tile the weights
            k = compression.slices
            for first in range(len(records) - k + 1):
                spans = sorted(tuple(r["synced"]) for r in records[first:first + k])
                assert spans[0][0] == 0 and spans[-1][1] == LENET_WEIGHTS, spans
                assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), spans
        if compression.kind == "threshold":  # it sent a part, not everything
            fractions = [r["pushed_values"] / LENET_WEIGHTS for r in records]
            assert min(fractions) < 0.5, fractions
            if compression.fraction:  # about the fraction it keeps, every round
                assert all(0.005 <= f <= 0.02 for f in fractions), fractions
