"""The served fast path of a given commit under this checkout's load generator.

    python served.py OUT.json [--server-path DIR] [--model DIR] [--workload WL.json]
                     [--concurrency 64] [--server-threads 1] [--max-seqs N]

Starts `veil serve` on loopback from --server-path (a folder holding a `veil` link to the
commit's tree, put first on the server's PYTHONPATH; default: this checkout), replays the
workload with veil.benchmarks.engine_throughput's streaming client at the given concurrency, and
reads the server's engine steps from /metrics. Only the server's code differs between commits.
"""
import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from veil.benchmarks.engine_throughput import run_fast, server_step_counts
from veil.benchmarks.stats import summarize
from veil.benchmarks.workload import Workload
from veil.server.runner import free_port


def host_seconds(url: str) -> float:
    """The engine loop's host seconds so far (the server's /metrics; 0 where it lacks them)."""
    line = "veil_engine_host_seconds_total "
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return next((float(x[len(line):]) for x in text.splitlines() if x.startswith(line)), 0.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--server-path")
    ap.add_argument("--model")
    ap.add_argument("--workload", type=Path)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--server-threads", type=int, default=1)
    ap.add_argument("--max-seqs", type=int)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    env = dict(os.environ)
    if args.server_path:
        env["PYTHONPATH"] = args.server_path
    tmp = Path(tempfile.mkdtemp())
    py = sys.executable
    key = subprocess.run([py, "-m", "veil.cli.main", "tenants", "add", "bench", "--scope", "plaintext", "--file",
                          str(tmp / "t.json")], check=True, capture_output=True, text=True, env=env).stdout.strip()
    port = free_port()
    cmd = [py, "-m", "veil.cli.main", "serve", "--tenants", str(tmp / "t.json"), "--port", str(port),
           "--kv-cache-gb", "2", "--max-tokens-per-step", "8192", "--threads", str(args.server_threads),
           "--dtype", args.dtype, *(["--model", args.model] if args.model else []),
           *(["--max-seqs-per-step", str(args.max_seqs)] if args.max_seqs else [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp / "server.log", "w"), env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise SystemExit((tmp / "server.log").read_text()[-2000:])
            time.sleep(0.5)
        h = {"Authorization": f"Bearer {key}"}
        model = httpx.get(f"{url}/v1/models", headers=h).json()["data"][0]["id"]
        wl = Workload.from_json(args.workload) if args.workload else None
        if wl is None:
            from veil.benchmarks.workload import random_workload
            wl = random_workload()
        steps0, seqs0, _ = server_step_counts(url)  # the third (host seconds) came with 543e460
        host0 = host_seconds(url)
        records, duration = asyncio.run(run_fast(url, key, wl, args.concurrency, float("inf"), model))
        steps1, seqs1, _ = server_step_counts(url)
        host1 = host_seconds(url)
    finally:
        proc.terminate()
        proc.wait(60)
    s = summarize(records, duration)
    s.update({"steps": steps1 - steps0, "steps_s": (steps1 - steps0) / duration,
              "mean_seqs_per_step": (seqs1 - seqs0) / max(steps1 - steps0, 1),
              "host_ms_per_step": 1e3 * (host1 - host0) / max(steps1 - steps0, 1),
              "server": args.server_path or "this checkout", "concurrency": args.concurrency})
    for k in ("output_tok_s", "errors", "steps_s", "mean_seqs_per_step", "host_ms_per_step"):
        print(f"figure served.{k} {s[k]:.6g}")
    args.out.write_text(json.dumps(s, indent=1, default=str))


if __name__ == "__main__":
    main()
