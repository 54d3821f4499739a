"""esync.infra.memory: glibc's thresholds at their ceiling in a training process, so that
a CPU device's iterations stop mapping and unmapping their activations; the user's own
allocator settings left alone."""
import os
import subprocess
import sys

import pytest

from esync.infra import memory

#: a small convolutional net's training iterations in a fresh process: the minor page
#: faults an iteration after three to warm up (glibc's defaults unmap and fault in its
#: activations, 1-4 MiB at batch 32, every iteration)
CHILD = """
import resource, sys, torch
from torch import nn
from esync.infra.memory import keep_freed_memory
torch.set_num_threads(1)
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
def iteration():
    nn.functional.cross_entropy(model(x), y).backward()
for _ in range(3):
    iteration()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    iteration()
print(applied, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def huge_pages_always() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


def faults_per_iteration(how: str, **env) -> tuple:
    environ = {k: v for k, v in os.environ.items()
               if k not in memory.USER_SETTINGS and k != "LD_PRELOAD"}
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", CHILD, how], env=environ, check=True,
                         capture_output=True, text=True, timeout=120).stdout.split()
    return out[0], float(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_a_process_at_the_ceiling_stops_faulting_its_activations_in():
    applied, kept = faults_per_iteration("keep")
    if applied != "True":
        pytest.skip("the C library is not glibc")
    _, plain = faults_per_iteration("plain")
    if plain <= 200 and huge_pages_always():
        pytest.skip("transparent huge pages always: a fresh 4 MiB block faults in a few "
                    "huge pages, too few to tell the two apart")
    assert plain > 200, plain  # glibc's defaults: the activations mapped afresh
    assert kept < plain / 10, (kept, plain)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_the_user_s_malloc_settings_win():
    applied, _ = faults_per_iteration("keep",
                                      GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")
    assert applied == "False"


def test_what_counts_as_the_user_s_choice():
    assert memory.users_choice({}) is None
    assert memory.users_choice({"MALLOC_TRIM_THRESHOLD_": "0"}) == "MALLOC_TRIM_THRESHOLD_"
    assert memory.users_choice({"MALLOC_MMAP_THRESHOLD_": ""}) is None  # empty: unset
    assert memory.users_choice({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}) == \
        "LD_PRELOAD (jemalloc)"
    assert memory.users_choice({"LD_PRELOAD": "/opt/libfoo.so"}) is None
    assert memory.users_choice({"GLIBC_TUNABLES": "glibc.cpu.x86_shstk=off"}) is None
    assert memory.users_choice({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == \
        "GLIBC_TUNABLES"
    assert memory.keep_freed_memory({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1"}) \
        is False
