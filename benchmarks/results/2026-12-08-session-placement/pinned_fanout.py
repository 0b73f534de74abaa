"""Pinned calls routed at the same moment on `veil serve --replicas 2`: do they reach their replica?

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/results/2026-12-08-session-placement/pinned_fanout.py [ROUNDS]

Each round opens sessions until each replica holds one, waits 11 s (Ray's router forgets a
replica's queue length after 10 s, so the next calls probe the replicas first), then at once
sends `DELETE` for both sessions and a `GET /health` (which asks both replicas together).
A `DELETE` routed to the wrong replica answers 404 (that replica does not hold the session);
a /health whose two asks both reached one replica lists one replica. Prints per round and
`figure` lines: the share of `DELETE`s answered 404 and of /health answers listing fewer than
2 replicas."""

import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from veil.benchmarks.cluster import launch_cluster

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 8

with tempfile.TemporaryDirectory() as tmp:
    srv = launch_cluster(Path(tmp), 2, ("plaintext",), ["--kv-cache-gb", "0.0625"])
    try:
        hdr = {"Authorization": f"Bearer {srv.key}"}
        deletes, healths = [], []
        with httpx.Client(base_url=srv.url, headers=hdr, timeout=120) as http, ThreadPoolExecutor(3) as pool:
            for r in range(ROUNDS):
                held, spare = {}, []  # one session per replica; the rest closed
                while len(held) < 2:
                    sid = http.post("/v1/sessions", json={"path": "plaintext"}).raise_for_status().json()["id"]
                    if sid.split(".")[0] in held:
                        spare.append(sid)
                    else:
                        held[sid.split(".")[0]] = sid
                for sid in spare:
                    http.delete(f"/v1/sessions/{sid}")
                time.sleep(11)
                futs = [pool.submit(http.delete, f"/v1/sessions/{sid}") for sid in held.values()]
                futs.append(pool.submit(http.get, "/health"))
                codes = [f.result().status_code for f in futs[:2]]
                running = futs[2].result().json()["replicas"]["running"]
                deletes += codes
                healths.append(running)
                print(f"round {r}: DELETE {codes}, /health lists {running} replicas", flush=True)
    finally:
        srv.stop()

out = {"rounds": ROUNDS, "delete_codes": deletes, "health_running": healths,
       "delete_404_share": sum(c == 404 for c in deletes) / len(deletes),
       "health_short_share": sum(n < 2 for n in healths) / len(healths)}
print(f"figure cluster.pinned.delete_404_share {out['delete_404_share']:.2f}")
print(f"figure cluster.pinned.health_short_share {out['health_short_share']:.2f}")
print(json.dumps(out))
