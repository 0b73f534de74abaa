import threading, time, torch, sys
torch.set_num_threads(2)
from veil.kernels.linear import Linear
w = torch.randn(3072, 576, dtype=torch.bfloat16)
x = torch.randn(16, 576, dtype=torch.bfloat16)
lin = Linear(w, "cpu")
def work(tag, n=2000):
    for _ in range(50): lin(x)
    t = time.perf_counter()
    for _ in range(n):
        y = lin(x); z = (y.float() * 2).to(torch.bfloat16); z = z + 1
    print(tag, "%.1f us/iter" % ((time.perf_counter() - t) / n * 1e6), flush=True)
work("main")
time.sleep(2)
th = threading.Thread(target=work, args=("side after 2 s sleep",)); th.start(); th.join()
def only_mm(tag, n=2000):
    for _ in range(50): lin(x)
    t = time.perf_counter()
    for _ in range(n): lin(x)
    print(tag, "%.1f us/iter" % ((time.perf_counter() - t) / n * 1e6), flush=True)
only_mm("main mm only")
th = threading.Thread(target=only_mm, args=("side mm only",)); th.start(); th.join()
def elt(tag, n=2000):
    y = torch.randn(16, 3072, dtype=torch.bfloat16)
    t = time.perf_counter()
    for _ in range(n): z = (y.float() * 2).to(torch.bfloat16); z = z + 1
    print(tag, "%.1f us/iter" % ((time.perf_counter() - t) / n * 1e6), flush=True)
elt("main elementwise")
th = threading.Thread(target=elt, args=("side elementwise",)); th.start(); th.join()
