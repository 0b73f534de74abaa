"""Keep freed memory in the process heap, so large CPU tensors reuse pages.

glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh mapping
and unmaps it on free, so each such tensor pays a page fault and the kernel's zeroing for
every 4 KiB page it touches. The native CKKS backend allocates tens of MB per key switch on
the CPU (a hoisted set's products, its ModDown); measured on the 2-core development VM
(benchmarks/results/2026-11-27-rotations, heap_micro.py): a fresh 37.7 MB tensor filled by a
copy took 15.2 ms, 2.8 ms with the heap kept, 2.5 ms copied into a reused buffer.

``keep_freed_memory`` turns glibc's mmap path off (``M_MMAP_MAX`` 0) and never trims the heap
(``M_TRIM_THRESHOLD`` -1, which glibc documents as "never"; its largest positive value, 2^31 - 1,
still gave the top back once more than 2 GiB of it was free: results 2026-12-07-first-prompt), for
the whole process: freed blocks go back to malloc's free lists and the next tensor takes them.
The price is that the process never gives memory back to the system before it exits: its
resident size stays at its peak. ``VEIL_KEEP_HEAP=0`` leaves glibc's policy alone; other C
libraries are left alone too.

It also keeps every thread on the main arena (``M_ARENA_MAX`` 1). glibc gives other threads
arenas of their own, whose heaps hold at most 64 MiB: a larger block allocated on any thread but
the main one is mapped fresh and unmapped on free, whatever ``M_MMAP_MAX`` says. A server
computes its protected steps on a worker thread, where a prompt's span or a batch of sessions
allocates blocks of hundreds of MB (``benchmarks/results/2026-12-07-ttft-split``). Set late,
the limit reaches a new thread only where no thread has ended before: glibc hands a new thread
an ended thread's arena first. ``veil serve`` makes its first native backend (and so calls
this) before its engine loop and HE threads start; a Ray worker's own threads come first (an
actor's new thread mapped 40 of 40 blocks afresh: results 2026-12-07-ci-heap), so ``worker_env`` gives
the processes another program launches (``veil serve --replicas``) the limit from their start.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

__all__ = ["keep_freed_memory", "grow", "worker_env"]

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8  # glibc's malloc.h


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library with ``mallopt``, ``malloc`` and ``free`` typed; None where it has no
    ``mallopt`` (not glibc: musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError):
        return None
    libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None
    return libc


@functools.cache
def keep_freed_memory() -> bool:
    """Once per process; whether glibc now keeps freed memory (False: not glibc, or turned off)."""
    if os.environ.get("VEIL_KEEP_HEAP", "1") == "0" or (libc := _glibc()) is None:
        return False
    kept = all(libc.mallopt(option, value) for option, value in
               ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1), (_M_ARENA_MAX, 1)))
    log.info("glibc keeps freed memory in the heap: %s", kept)
    return kept


def grow(nbytes: int) -> int:
    """Grow the kept heap by ``nbytes``: one block taken, every page of it touched, and freed,
    so that later blocks reuse those pages instead of faulting in fresh ones. A fresh server's
    first protected prompt otherwise pays for that growth (``veil serve --protected-warmup``
    grows it at start: results 2026-12-07-warmup-span). Never by more than half the memory the
    system has available now: a process grown into swap or the OOM killer is worse off than one
    that faults pages in later. Turns ``keep_freed_memory`` on (freed, the block would otherwise
    go back to the system at once). Returns the bytes grown: 0 where that is off, ``nbytes`` is
    not positive or the block could not be had."""
    available = _available_bytes()
    if available is not None:
        nbytes = min(nbytes, available // 2)
    if nbytes <= 0 or not keep_freed_memory():
        return 0
    libc = _glibc()
    block = libc.malloc(nbytes)
    if not block:  # no room: the pages will be faulted in where they are needed, as before
        return 0
    try:
        ctypes.memset(block, 0, nbytes)
    finally:
        libc.free(block)
    return nbytes


def _available_bytes() -> int | None:
    """The kernel's estimate of the memory available without swapping (``MemAvailable``), or None
    where there is no /proc/meminfo."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def worker_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """Environment variables that give a process launched with them one malloc arena from its
    start (glibc's tunable), appended to the ``GLIBC_TUNABLES`` of ``env`` (default: this
    process's); empty where ``VEIL_KEEP_HEAP=0``. The rest of ``keep_freed_memory`` still runs
    there when its first native backend is made."""
    env = os.environ if env is None else env
    if env.get("VEIL_KEEP_HEAP", "1") == "0":
        return {}
    tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and not t.startswith("glibc.malloc.arena_max=")]
    return {"GLIBC_TUNABLES": ":".join([*tunables, "glibc.malloc.arena_max=1"])}
