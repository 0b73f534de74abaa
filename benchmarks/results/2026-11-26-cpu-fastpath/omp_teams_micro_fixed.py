import threading, time, torch
torch.set_num_threads(1)   # main: everything inline, no OpenMP team
from veil.kernels.linear import Linear
w = torch.randn(3072, 576, dtype=torch.bfloat16)
x = torch.randn(16, 576, dtype=torch.bfloat16)
lin = Linear(w, "cpu")
big = torch.randn(1 << 22); big.mul_(2)
def work(tag, n=2000, threads=None):
    if threads: torch.set_num_threads(threads)
    for _ in range(50): lin(x)
    t = time.perf_counter()
    for _ in range(n):
        y = lin(x); z = (y.float() * 2).to(torch.bfloat16); z = z + 1
    print(tag, "%.1f us/iter" % ((time.perf_counter() - t) / n * 1e6), torch.get_num_threads(), flush=True)
work("main 1 thread")
th = threading.Thread(target=work, args=("side sets 2",), kwargs={"threads": 2}); th.start(); th.join()
big.mul_(2)  # main again, now global num_threads is 2: a team for main
th = threading.Thread(target=work, args=("side after main's big op",), kwargs={"threads": 2}); th.start(); th.join()
