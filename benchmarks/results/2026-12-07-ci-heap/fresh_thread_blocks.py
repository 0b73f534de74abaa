"""Blocks of 100 MiB faulted in by six fresh threads in turn, 20 blocks each (the first version of
tests/test_heap.py counted the second): `PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-ci-heap/fresh_thread_blocks.py`,
eight times. Prints whether the heap is kept and each thread's faults in blocks."""
import resource, sys, threading
import torch
from veil.kernels import heap
kept = heap.keep_freed_memory()
def work():
    x = torch.empty(100 << 17, dtype=torch.int64)
    for _ in range(20):
        y = torch.empty_like(x); y.fill_(1); del y
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
out=[]
for _ in range(6):
    f = faults(); t = threading.Thread(target=work); t.start(); t.join(); out.append(round((faults() - f)/25600,1))
print(kept, out)
