"""A fresh `veil serve --k K --protected-warmup --he-backend native` (CPU): once /health says the
protected path is ready, two clients one after the other, each with keys of its own (uploaded
before its prompts) and two protected prompts of 8 tokens (a session each). For each prompt: its
TTFT, the server's minor page faults during it (/proc/<pid>/stat) and its seconds by operation
(/metrics); and the seconds from the server's start to ready, and its resident size at the end.
One JSON line. Which code serves is whatever `veil` imports (PYTHONPATH picks a tree).

    PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-warmup-span/first_prompt.py LABEL [K]
"""
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

from veil.benchmarks.engine_throughput import launch_server
from veil.benchmarks.protected_overhead import server_op_seconds
from veil.client import VeilClient
from veil.engine.loader import load_checkpoint
from veil.engine.split import client_half_from

PROMPT = "The capital of France is a city that"  # 8 tokens: one span
CLIENTS = 2  # each with its own keys, uploaded before its prompts


def faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])  # minflt


def main(label: str, k: int) -> None:
    ckpt = load_checkpoint(None)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        proc, url, key = launch_server(Path(tmp), ("protected",), ["--k", str(k), "--kv-cache-gb", "0.03",
                                                                  "--he-backend", "native", "--protected-warmup"])
        try:
            while not httpx.get(f"{url}/health").json()["protected"]["ready"]:
                time.sleep(0.2)
            ready_s = time.monotonic() - t0
            out = {"label": label, "k": k, "ready_s": round(ready_s, 1), "ttft_s": [], "prompt_faults": []}
            for _ in range(CLIENTS):
                with VeilClient(url, key, mode="protected", half=client_half_from(ckpt, k)) as client:
                    client.generate_keys(progress=False)
                    client.ensure_keys()
                    ids = client.tokenizer(PROMPT)["input_ids"]
                    out["prompt_tokens"] = len(ids)
                    for _ in range(2):
                        s = client.open_session()
                        ops0, f0, t = server_op_seconds(url), faults(proc.pid), time.perf_counter()
                        s.forward(ids)
                        out["ttft_s"].append(round(time.perf_counter() - t, 2))
                        out["prompt_faults"].append(faults(proc.pid) - f0)
                        ops1 = server_op_seconds(url)
                        out.setdefault("server_s", []).append({op: round(ops1[op] - ops0.get(op, 0.0), 2)
                                                               for op in ops1})
                        s.close()
            out["server_rss_gb"] = round(int(Path(f"/proc/{proc.pid}/statm").read_text().split()[1]) * 4096 / 2**30, 2)
        finally:
            proc.terminate()
            proc.wait(60)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 28)
