"""Seconds from `veil serve` (plaintext scope, the shipped model) to its first /health 200, and
of load_checkpoint() in a fresh process, with the model cache off, cold (empty) and warm;
alternating, 3 rounds. Run with the project venv from the repository root:

    .venv/bin/python benchmarks/results/2026-12-02-model-cache/startup.py OUT.json
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from veil.benchmarks.engine_throughput import launch_server

LOAD = "import time; t=time.perf_counter(); from veil.engine.loader import load_checkpoint; load_checkpoint(); print(time.perf_counter()-t)"


def serve_s(env_cache: str) -> float:
    os.environ["VEIL_MODEL_CACHE"] = env_cache
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        proc, _, _ = launch_server(Path(tmp), ("plaintext",), [])
        s = time.perf_counter() - t0
        proc.terminate()
        proc.wait(30)
    return s


def load_s(env_cache: str) -> float:
    out = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, check=True,
                         env={**os.environ, "VEIL_MODEL_CACHE": env_cache})
    return float(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    res = {"serve_s": {"off": [], "cold": [], "warm": []}, "load_s": {"off": [], "cold": [], "warm": []}}
    for _ in range(3):
        for what, fn in (("serve_s", serve_s), ("load_s", load_s)):
            with tempfile.TemporaryDirectory() as cache:
                res[what]["off"].append(fn("off"))
                res[what]["cold"].append(fn(cache))  # converts and writes the entry
                res[what]["warm"].append(fn(cache))
    for what, by in res.items():
        for mode, xs in by.items():
            print(f"figure startup.{what}.{mode} {min(xs):.2f}")
            print(f"# {what} {mode} runs: {', '.join(f'{x:.2f}' for x in xs)}")
    Path(sys.argv[1]).write_text(json.dumps(res, indent=2))
