"""Where sequential session creations land on `veil serve --replicas 2`.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/results/2026-12-08-session-placement/place.py [ROUNDS]

Each round opens 8 plaintext sessions one after another (each waits for the previous answer,
as a client that opens its sessions in turn does) and records the replica in each session id.
Then it closes the sessions of the replica that got more (either, on a tie), waits 5 s (longer
than the router's window for the sessions it opened itself: only the replicas' own counts tell
it where sessions are now) and opens as many again: `refill` is how many of those went to the
replica they were closed on (all of them is the even split). Then it closes everything.
Prints per round and `figure` lines: the mean imbalance after the first 8 (|sessions on one
replica - on the other|, 0 is even), the share of even rounds, and the mean refill share."""

import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

from veil.benchmarks.cluster import launch_cluster

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
PER_ROUND = 8

with tempfile.TemporaryDirectory() as tmp:
    srv = launch_cluster(Path(tmp), 2, ("plaintext",), ["--kv-cache-gb", "0.0625"])
    try:
        http = httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {srv.key}"}, timeout=120)
        splits, refills = [], []
        for r in range(ROUNDS):
            ids = []
            for _ in range(PER_ROUND):
                resp = http.post("/v1/sessions", json={"path": "plaintext"})
                resp.raise_for_status()
                ids.append(resp.json()["id"])
            on = {}
            for sid in ids:
                on[sid.split(".")[0]] = on.get(sid.split(".")[0], 0) + 1
            split = sorted(on.values(), reverse=True) + [0] * (2 - len(on))
            splits.append(split)
            emptied = max(on, key=on.get)
            for sid in [sid for sid in ids if sid.startswith(emptied + ".")]:
                http.delete(f"/v1/sessions/{sid}").raise_for_status()
                ids.remove(sid)
            time.sleep(5)
            again = []
            for _ in range(split[0]):
                resp = http.post("/v1/sessions", json={"path": "plaintext"})
                resp.raise_for_status()
                again.append(resp.json()["id"])
            refills.append(sum(sid.startswith(emptied + ".") for sid in again) / len(again))
            print(f"round {r}: {split[0]} / {split[1]}, refill {refills[-1]:.2f}", flush=True)
            for sid in ids + again:
                http.delete(f"/v1/sessions/{sid}").raise_for_status()
            time.sleep(5)  # the next round starts from closed sessions
    finally:
        srv.stop()

imb = [a - b for a, b in splits]
out = {"rounds": ROUNDS, "per_round": PER_ROUND, "splits": splits,
       "mean_imbalance": sum(imb) / len(imb), "even_share": sum(i == 0 for i in imb) / len(imb),
       "refills": refills, "mean_refill": sum(refills) / len(refills)}
print(f"figure cluster.placement.mean_imbalance {out['mean_imbalance']:.2f}")
print(f"figure cluster.placement.even_share {out['even_share']:.2f}")
print(f"figure cluster.placement.mean_refill {out['mean_refill']:.2f}")
print(json.dumps(out))
