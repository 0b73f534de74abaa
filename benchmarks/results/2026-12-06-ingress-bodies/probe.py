"""Uploads without a valid API key against `veil serve --replicas 1` (Ray Serve) on loopback: N
POST /v1/keys of 900 MB each, at once, sent as fast as loopback goes, with a made-up key; prints
each answer, how long it took, and the peak RSS of the ingress's process and of the whole server
(every process of its tree: the peaks need not be simultaneous). Run from the checkout:
PYTHONSAFEPATH=1 .venv/bin/python <this file> [N]."""
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

from veil.benchmarks.cluster import launch_cluster, tree_peak_rss

n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
tmp = Path(tempfile.mkdtemp())
srv = launch_cluster(tmp, 1, ("plaintext", "protected"), ["--kv-cache-gb", "0.0625"])
size, piece = 900 << 20, b"\x01" * (1 << 20)


def ingress_process() -> psutil.Process:
    for p in psutil.Process(srv.proc.pid).children(recursive=True):
        try:
            if "Ingress" in " ".join(p.cmdline()):
                return p
        except psutil.Error:
            pass
    raise RuntimeError("no ingress process")


def hwm(p: psutil.Process) -> int:
    for line in open(f"/proc/{p.pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    return 0


def upload(out: list, i: int):
    t0 = time.time()
    try:
        r = httpx.post(f"{srv.url}/v1/keys", content=(piece for _ in range(size >> 20)), timeout=600,
                       headers={"Authorization": "Bearer veil_not-a-key", "Content-Length": str(size)})
        out[i] = f"{r.status_code} {r.text[:100]} after {time.time() - t0:.2f} s"
    except httpx.HTTPError as e:
        out[i] = f"failed after {time.time() - t0:.2f} s: {type(e).__name__} {e}"


try:
    ing = ingress_process()
    print(f"ingress pid {ing.pid}: RSS at start {ing.memory_info().rss >> 20} MB, peak so far {hwm(ing) >> 20} MB; "
          f"server tree peak so far {tree_peak_rss(srv.proc.pid) >> 20} MB")
    out = [None] * n
    t0 = time.time()
    threads = [threading.Thread(target=upload, args=(out, i)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, o in enumerate(out):
        print(f"upload {i}: {o}")
    print(f"{n} uploads of {size >> 20} MB with a made-up key in {time.time() - t0:.1f} s; ingress peak RSS "
          f"{hwm(ing) >> 20} MB; server tree peak {tree_peak_rss(srv.proc.pid) >> 20} MB")
    print("health", srv.health()["status"])
finally:
    srv.stop()
