"""One tenant's concurrent key uploads against a `veil serve` on loopback (protected scope, its
default limits): N uploads of 900 MB of bytes that are not keys, at once, each sent as fast as
loopback goes; prints each answer and the server's peak RSS while they ran. Run from the
checkout: PYTHONSAFEPATH=1 .venv/bin/python <this file> [N]."""
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

from veil.benchmarks.engine_throughput import launch_server

n = int(sys.argv[1]) if len(sys.argv) > 1 else 6
tmp = Path(tempfile.mkdtemp())
proc, url, key = launch_server(tmp, ("plaintext", "protected"), ["--max-context", "64"])
ps, peak, done = psutil.Process(proc.pid), [0], threading.Event()
size, piece = 900 << 20, b"\x01" * (1 << 20)


def watch():
    while not done.is_set():
        try:
            peak[0] = max(peak[0], ps.memory_info().rss)
        except psutil.Error:
            return
        time.sleep(0.05)


def upload(out: list, i: int):
    try:
        r = httpx.post(f"{url}/v1/keys", content=(piece for _ in range(size >> 20)), timeout=600,
                       headers={"Authorization": f"Bearer {key}", "Content-Length": str(size)})
        out[i] = f"{r.status_code} {r.text[:100]}"
    except httpx.HTTPError as e:
        out[i] = f"failed: {type(e).__name__} {e}"


try:
    print("rss start MB", ps.memory_info().rss >> 20)
    threading.Thread(target=watch, daemon=True).start()
    out = [None] * n
    t0 = time.time()
    threads = [threading.Thread(target=upload, args=(out, i)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    for i, o in enumerate(out):
        print(f"upload {i}: {o}")
    alive = proc.poll() is None
    print(f"{n} uploads of {size >> 20} MB in {time.time() - t0:.1f} s; server peak RSS {peak[0] >> 20} MB; alive {alive}")
    if alive:
        print("health", httpx.get(f"{url}/health").status_code)
finally:
    proc.terminate()
    proc.wait(60)
