"""Native HE op timings in the main thread vs a second thread, with an OpenMP team already
owned by another thread (as the engine loop owns one in `veil serve`)."""
import sys, threading, time, statistics
import numpy as np, torch
from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
mode = sys.argv[1]  # main | thread | thread1
c = make_backend(PROTECTED_PARAMS, "native"); c.generate_keys({1: 7, 2: 7, 3: 7})
s = make_backend(PROTECTED_PARAMS, "native"); s.import_public_material(c.export_public_material())
ct = c.encrypt(np.random.default_rng(0).standard_normal(8192))
def engine_loop():  # owns a team of all cores, then idles (between steps)
    torch.set_num_threads(2); a = torch.randn(512, 512); [a @ a for _ in range(20)]
if mode not in ("main", "main1"):
    t = threading.Thread(target=engine_loop); t.start(); t.join()  # thread gone, but its team?
    ev = threading.Event()
    keep = threading.Thread(target=lambda: (engine_loop(), ev.wait())); keep.start()
out = {}
def work():
    if mode == "thread1":
        torch.set_num_threads(1)
    for name, fn in (("rotate", lambda: s.rotate(ct, 1)), ("rotate_many3", lambda: s.rotate_many(ct, [1, 2, 3])),
                     ("mul_plain", lambda: s.multiply_plain(ct, s.encode(np.ones(8192), 7, 2.0**36)))):
        fn(); ts = []
        for _ in range(5):
            t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
        out[name] = statistics.median(ts) * 1e3
if mode == "main1":
    torch.set_num_threads(1); work()
elif mode == "main":
    work()
else:
    w = threading.Thread(target=work, name="veil-he"); w.start(); w.join(); ev.set()
print(mode, {k: round(v, 1) for k, v in out.items()})
