"""Page faults of a 100 MiB (and a 32 MiB) tensor allocated 20 times on a thread other than the
main one, with glibc's mmap path off and no trimming (what ``kernels/heap.keep_freed_memory`` set
before 2026-12-07), and with one arena for every thread too (``one-arena``, what it sets since).
Run: ``python arena_faults.py`` and ``python arena_faults.py one-arena``. Standalone (no veil
import): the options are set here, before torch is imported."""
import ctypes
import resource
import sys
import threading

libc = ctypes.CDLL("libc.so.6")
options = [(-4, 0), (-1, 2**31 - 1)] + ([(-8, 1)] if "one-arena" in sys.argv else [])  # M_MMAP_MAX, M_TRIM_THRESHOLD, M_ARENA_MAX
print("mallopt", [(o, v, libc.mallopt(o, v)) for o, v in options])
import torch  # noqa: E402


def work(mb):
    x = torch.empty(mb * (1 << 20) // 8, dtype=torch.int64)
    for _ in range(20):
        y = torch.empty_like(x)
        y.fill_(1)
        del y


def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


for mb in (32, 100, 100):
    f = faults()
    th = threading.Thread(target=work, args=(mb,))
    th.start()
    th.join()
    print(f"thread {mb} MiB x20: {faults() - f} page faults")
