"""One key upload of a valid tenant through `veil serve --replicas 1` (Ray Serve) on loopback:
how much memory the ingress and the replica take to pass it on.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/results/2026-12-08-key-upload-copies/probe.py [MB]

Sends one `POST /v1/keys` of MB megabytes (default 900) with the tenant's real API key. The
bytes are not a key set, so the replica answers 400 after reading them: the copies on the way
(the ingress's read, Ray's hand-over, the replica app's read) are all made, the import is not.
Prints the answer, its time, and the growth of the peak RSS (VmHWM) of the ingress's process and
of the replica's process over their peaks before the upload, in MB and in multiples of the body."""
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from veil.benchmarks.cluster import launch_cluster

mb = int(sys.argv[1]) if len(sys.argv) > 1 else 900
size, piece = mb << 20, b"\x01" * (1 << 20)
tmp = Path(tempfile.mkdtemp())
srv = launch_cluster(tmp, 1, ("plaintext", "protected"), ["--kv-cache-gb", "0.0625"])


def process(name: str) -> psutil.Process:
    for p in psutil.Process(srv.proc.pid).children(recursive=True):
        try:
            if name in " ".join(p.cmdline()):
                return p
        except psutil.Error:
            pass
    raise RuntimeError(f"no {name} process")


def hwm(p: psutil.Process) -> int:
    for line in open(f"/proc/{p.pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    return 0


try:
    procs = {"ingress": process("Ingress"), "replica": process("VeilReplica")}
    before = {k: hwm(p) for k, p in procs.items()}
    t0 = time.time()
    r = httpx.post(f"{srv.url}/v1/keys", content=(piece for _ in range(mb)), timeout=600,
                   headers={"Authorization": f"Bearer {srv.key}", "Content-Length": str(size)})
    print(f"upload of {mb} MB: {r.status_code} {r.text[:120]} after {time.time() - t0:.2f} s")
    for k, p in procs.items():
        grew = hwm(p) - before[k]
        print(f"figure cluster.key_upload.{k}_peak_growth_mb {grew >> 20}")
        print(f"figure cluster.key_upload.{k}_peak_growth_bodies {grew / size:.2f}")
    print("health", srv.health()["status"])
finally:
    srv.stop()
