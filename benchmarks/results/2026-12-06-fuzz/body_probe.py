"""A 300 MB JSON prompt, without and with a key, and a deeply nested JSON body, against a
`veil serve` on loopback: each answer, its time and the server's RSS after it. Run from the
checkout: PYTHONSAFEPATH=1 .venv/bin/python <this file>."""
import os, tempfile, time, threading
from pathlib import Path
import httpx, psutil
from veil.benchmarks.engine_throughput import launch_server

tmp = Path(tempfile.mkdtemp())
proc, url, key = launch_server(tmp, ("plaintext", "protected"), ["--max-context", "64"])
ps = psutil.Process(proc.pid)
try:
    print("rss start MB", ps.memory_info().rss >> 20)
    for auth in (None, key):
        H = {"Content-Type": "application/json", **({"Authorization": f"Bearer {auth}"} if auth else {})}
        big = b'{"prompt": "' + b"a" * (300 << 20) + b'", "max_tokens": 2}'
        t = time.time()
        try:
            r = httpx.post(f"{url}/v1/completions", content=big, headers=H, timeout=300)
        except httpx.HTTPError as e:
            print("request failed:", e, "server alive:", proc.poll() is None, "rss MB", ps.memory_info().rss >> 20 if proc.poll() is None else None)
            print((tmp / "server.log").read_text()[-3000:])
            raise
        print("auth" if auth else "no auth", "300MB body:", r.status_code, r.text[:120], f"{time.time()-t:.1f}s", "rss MB", ps.memory_info().rss >> 20)
        deep = b'{"prompt": "hi", "x": ' + b"[" * 200000 + b"]" * 200000 + b"}"
        r = httpx.post(f"{url}/v1/completions", content=deep, headers=H, timeout=300)
        print("deep nesting:", r.status_code, r.text[:120], "rss MB", ps.memory_info().rss >> 20)
        long = b'{"prompt": "' + b"a " * (1 << 20) + b'", "max_tokens": 2}'
        t = time.time()
        r = httpx.post(f"{url}/v1/completions", content=long, headers=H, timeout=300)
        print("2 MB prompt:", r.status_code, r.text[:120], f"{time.time()-t:.2f}s", "rss MB", ps.memory_info().rss >> 20)
    print("health", httpx.get(f"{url}/health").status_code)
finally:
    proc.terminate(); proc.wait(60)
log = (tmp / "server.log").read_text()
print([l for l in log.splitlines() if "Error" in l or "Traceback" in l][:10])
