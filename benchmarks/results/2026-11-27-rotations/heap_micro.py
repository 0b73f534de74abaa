"""A fresh 37.7 MB int64 tensor (16 rotations x 2 x 9 limbs x N=16384) against a copy into a
reused one, with glibc's default policy and with the heap kept (``python heap_micro.py [keep]``;
kernels/heap.py sets the same two options)."""
import torch, time, ctypes, sys
torch.set_num_threads(2)
if len(sys.argv) > 1:
    libc = ctypes.CDLL("libc.so.6")
    print("mallopt mmap_max", libc.mallopt(-4, 0), "trim", libc.mallopt(-1, 2**31 - 1))  # M_MMAP_MAX=-4, M_TRIM_THRESHOLD=-1
x = torch.ones(16, 2, 9, 16384, dtype=torch.int64)
def t(f, r=20):
    f(); ts=[]
    for _ in range(r):
        a=time.perf_counter(); f(); ts.append(time.perf_counter()-a)
    return 1e3*sorted(ts)[r//2]
buf = torch.empty_like(x)
print("fresh clone ms", t(lambda: x.clone()))
print("copy into reused ms", t(lambda: buf.copy_(x)))
print("stack of 16 ms", t(lambda: torch.stack(list(x.unbind(0)))))
