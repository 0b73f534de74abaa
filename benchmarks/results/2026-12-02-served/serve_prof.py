"""Profile the served fast path's event-loop thread (the figures "loop busy 94 -> 49 -> 36 s"):
`veil serve` of this checkout under cProfile (which profiles the main thread, the event loop's,
not the engine's), 256 streams of the tiny model from engine_throughput's load generator, then
SIGINT so cProfile writes its file.

    OMP_NUM_THREADS=1 python serve_prof.py OUT.prof   # after tiny_hf.py /tmp/tinyhf /tmp/wl_tiny.json
    python -c "import pstats; pstats.Stats('OUT.prof').sort_stats('tottime').print_stats(30)"

Busy time = total minus the time in `select.epoll.poll`.
"""
import asyncio, os, signal, subprocess, sys, tempfile, time
from pathlib import Path
import httpx
from veil.benchmarks.engine_throughput import run_fast
from veil.benchmarks.workload import Workload
from veil.server.runner import free_port

tmp = Path(tempfile.mkdtemp())
py = sys.executable
key = subprocess.run([py, "-m", "veil.cli.main", "tenants", "add", "bench", "--scope", "plaintext", "--file",
                      str(tmp / "t.json")], check=True, capture_output=True, text=True).stdout.strip()
port = free_port()
out = sys.argv[1]
proc = subprocess.Popen([py, "-m", "cProfile", "-o", out, "-m", "veil.cli.main", "serve", "--tenants", str(tmp / "t.json"),
                         "--port", str(port), "--model", "/tmp/tinyhf", "--kv-cache-gb", "2", "--max-tokens-per-step", "8192",
                         "--max-seqs-per-step", "256", "--threads", "1"], stderr=open(tmp / "log", "w"))
url = f"http://127.0.0.1:{port}"
for _ in range(600):
    try:
        if httpx.get(f"{url}/health", timeout=2).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    time.sleep(0.5)
wl = Workload.from_json(Path("/tmp/wl_tiny.json"))
model = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}).json()["data"][0]["id"]
recs, dur = asyncio.run(run_fast(url, key, wl, 256, float("inf"), model))
print("tokens/s", sum(r.output_tokens for r in recs) / dur, "errors", sum(1 for r in recs if r.error))
proc.send_signal(signal.SIGINT)
proc.wait(60)
