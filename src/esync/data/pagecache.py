"""The page cache's hold on files, without root: the share of their pages it holds
(mincore(2), through ctypes) and dropping them (posix_fadvise(POSIX_FADV_DONTNEED)), so
that a benchmark reads its data from storage (bench/data.py, bench/cache.py).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
from typing import Optional, Sequence

import numpy as np


class Residency:
    """The share of a set of files' pages in the page cache, by mincore(2)."""

    def __init__(self):
        self.libc = None
        name = ctypes.util.find_library("c")
        if sys.platform.startswith("linux") and name:
            libc = ctypes.CDLL(name, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_int, ctypes.c_long]
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            self.libc = libc
        self.error = "" if self.libc else "no mincore on this platform"

    def share(self, paths: Sequence[str]) -> Optional[float]:
        """Cached pages over all pages of `paths`, or None where mincore failed."""
        if self.libc is None:
            return None
        cached = total = 0
        for path in paths:
            size = os.path.getsize(path)
            if size == 0:
                continue
            pages = -(-size // mmap.PAGESIZE)
            fd = os.open(path, os.O_RDONLY)
            try:
                addr = self.libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
                if addr is None or addr == ctypes.c_void_p(-1).value:
                    self.error = f"mmap: {os.strerror(ctypes.get_errno())}"
                    return None
                try:
                    vec = np.zeros(pages, np.uint8)
                    if self.libc.mincore(ctypes.c_void_p(addr), size,
                                         vec.ctypes.data_as(ctypes.c_void_p)) != 0:
                        self.error = f"mincore: {os.strerror(ctypes.get_errno())}"
                        return None
                finally:
                    self.libc.munmap(ctypes.c_void_p(addr), size)
            finally:
                os.close(fd)
            cached += int(np.count_nonzero(vec & 1))
            total += pages
        return cached / total if total else 0.0


def fadvise_dontneed(paths: Sequence[str]) -> str:
    """fsync and POSIX_FADV_DONTNEED every file; '' or what failed."""
    if not hasattr(os, "posix_fadvise"):
        return "no posix_fadvise on this platform"
    try:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e}"
    return ""


def drop_caches() -> str:
    """sync, then 1 into /proc/sys/vm/drop_caches (the whole machine's clean pages);
    '' or why not."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e}"
    return ""
