"""The process heap across batched steps: ``protected_sessions`` (its arguments, e.g.
``--sessions 4,4,4 --warmup``: six steps of four fresh sessions each) with glibc's own account
(``mallinfo2``: the heap's size, the bytes in use, the bytes free in it) and the RSS printed when
each step's first message (``token``) reaches the executor.

    python benchmarks/results/2026-12-03-context-leak/heap_steps.py --sessions 4,4,4 --warmup
"""

import ctypes
import sys

from veil.benchmarks import protected_sessions
from veil.protected import server


class MallInfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
handle_batch = server.ProtectedExecutor.handle_batch


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e9


def reporting(self, msgs):
    if msgs[0].kind == "token":
        m = libc.mallinfo2()
        print(f"# step of {len(msgs)}: RSS {rss_gb():.2f} GB, heap {m.arena / 1e9:.2f} GB, in use {m.uordblks / 1e9:.2f} GB, "
              f"free in the heap {m.fordblks / 1e9:.2f} GB ({m.ordblks} free chunks)", flush=True)
    return handle_batch(self, msgs)


server.ProtectedExecutor.handle_batch = reporting
protected_sessions.main(sys.argv[1:])
