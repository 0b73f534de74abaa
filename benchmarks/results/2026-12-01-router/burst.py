"""Bursts of 16 completions at once through `veil serve --replicas 2`; prints the split per burst.

    python burst.py ROUNDS GAP_S      (HOGS=N beside it: N busy loops started after the launch)
"""
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from veil.benchmarks.cluster import launch_cluster
from veil.cluster.routing import REPLICA_HEADER

rounds, gap = int(sys.argv[1]), float(sys.argv[2])
srv = launch_cluster(Path(tempfile.mkdtemp()), 2, ("plaintext",), ["--kv-cache-gb", "0.0625"])
hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(int(os.environ.get("HOGS", "0")))]
try:
    for rnd in range(rounds):
        served = []

        def one():
            with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {srv.key}"}, timeout=300) as c:
                r = c.post("/v1/completions", json={"prompt": [1, 2, 3, 4], "max_tokens": 12, "temperature": 0,
                                                    "ignore_eos": True})
                served.append(r.headers[REPLICA_HEADER])

        threads = [threading.Thread(target=one) for _ in range(16)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(f"burst {rnd} split {sorted(Counter(served).values())} wall_s {time.time() - t0:.2f}", flush=True)
        time.sleep(gap)
finally:
    for h in hogs:
        h.kill()
    srv.stop()
