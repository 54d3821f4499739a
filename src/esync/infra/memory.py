"""How a training process's C library hands freed memory back (glibc's malloc).

glibc serves a block above its mmap threshold (128 KiB at first) with a fresh mmap and
unmaps it when freed, and gives the top of its heap back past its trim threshold; each
time a block of that size is freed it raises both (up to 32 MiB and 64 MiB), so that a
process settles once it has freed its largest blocks. A CPU training process whose
activations are a few MiB each (the ResNet of the bench: 4 MiB at batch 32) may never
settle: its every iteration mapped, faulted in and unmapped them again, 6,600-9,300
page faults an iteration and 143-155 ms of computing against 127-132 ms at the ceiling
(measured in one process, 2026-12-06). A process that had once evaluated a large batch
(the fast device alone, evaluating in process) sat at the ceiling; one that never did
(a worker of a job, whose evaluator is another process) did not, and computed 13-24%
slower beside it on the same machine at the same time.

`keep_freed_memory` sets both thresholds to glibc's own ceiling at once, in every
process that trains or evaluates (esync.runtime.join, the evaluator), whatever the
algorithm, the fast device alone's included. A user's own choice wins: the MALLOC_*
variables or GLIBC_TUNABLES that set glibc's malloc, or another allocator preloaded
(jemalloc, tcmalloc, mimalloc) leave the process as it is."""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Mapping, Optional

#: mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: glibc's ceiling for its dynamic mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
MMAP_THRESHOLD = 32 << 20
#: ... and the trim threshold it sets beside it (twice the mmap threshold)
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
#: the environment by which a user sets glibc's malloc: each variable, and what its value
#: must hold to be about malloc ("": any value; GLIBC_TUNABLES also sets other parts)
USER_SETTINGS = {"MALLOC_MMAP_THRESHOLD_": "", "MALLOC_TRIM_THRESHOLD_": "",
                 "MALLOC_TOP_PAD_": "", "MALLOC_MMAP_MAX_": "",
                 "GLIBC_TUNABLES": "glibc.malloc."}
ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def users_choice(environ: Mapping[str, str]) -> Optional[str]:
    """What in `environ` already chose how malloc behaves (None: nothing)."""
    for name, about_malloc in USER_SETTINGS.items():
        value = environ.get(name)
        if value and about_malloc in value:
            return name
    preload = environ.get("LD_PRELOAD", "")
    for allocator in ALLOCATORS:
        if allocator in preload:
            return f"LD_PRELOAD ({allocator})"
    return None


def keep_freed_memory(environ: Mapping[str, str] = os.environ) -> bool:
    """Set glibc's mmap and trim thresholds to their ceiling in this process (see the
    module); True where they were set, False where the user chose otherwise or the C
    library is not glibc."""
    if not sys.platform.startswith("linux") or users_choice(environ) is not None:
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc's own: musl's mallopt does nothing
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
