"""A protected session on a one-replica `veil serve --replicas 1 --k 28 --engine-process`: its
prompt's and decode steps' wall time and the replica's minor page faults meanwhile (/proc/<pid>/stat),
and the replica's GLIBC_TUNABLES. Run from the checkout; `replica_arena_ab.sh` alternates the code.

    PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-ci-heap/replica_arena.py LABEL
"""
import json
import sys
import tempfile
import time
from pathlib import Path

import psutil

from veil.benchmarks.cluster import launch_cluster
from veil.client import VeilClient
from veil.engine.loader import load_checkpoint
from veil.engine.split import client_half_from

K, PROMPT, NEW = 28, "The capital of France is a city that", 3


def faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])  # minflt


def main(label: str) -> None:
    ckpt = load_checkpoint(None)
    with tempfile.TemporaryDirectory() as tmp:
        srv = launch_cluster(Path(tmp), 1, ("protected",), ["--k", str(K), "--engine-process", "--kv-cache-gb", "0.03"])
        try:
            (pid,) = srv.replica_pids().values()
            tunables = psutil.Process(pid).environ().get("GLIBC_TUNABLES")
            with VeilClient(srv.url, srv.key, mode="protected", half=client_half_from(ckpt, K)) as client:
                client.generate_keys(progress=False)
                s = client.open_session()
                ids = client.tokenizer(PROMPT)["input_ids"]
                f0, t0 = faults(pid), time.perf_counter()
                nxt = int(s.forward(ids).argmax())
                ttft, f1 = time.perf_counter() - t0, faults(pid)
                tpot = []
                for _ in range(NEW - 1):
                    t = time.perf_counter()
                    nxt = int(s.forward([nxt]).argmax())
                    tpot.append(time.perf_counter() - t)
                f2 = faults(pid)
                s.close()
        finally:
            srv.stop()
    out = {"label": label, "tunables": tunables, "prompt_tokens": len(ids), "ttft_s": round(ttft, 2),
           "tpot_s": [round(x, 2) for x in tpot], "prompt_faults": f1 - f0, "decode_faults": f2 - f1}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
