"""Chat and completion bodies with odd messages and text (content parts, missing roles, lone
surrogates spelled by JSON escapes) against a `veil serve` on loopback: prints each answer's
status. Run from the checkout: PYTHONSAFEPATH=1 .venv/bin/python <this file>."""
import json
import tempfile
from pathlib import Path
import httpx
from veil.benchmarks.engine_throughput import launch_server

tmp = Path(tempfile.mkdtemp())
proc, url, key = launch_server(tmp, ("plaintext", "protected"), ["--max-context", "64"])
H = {"Authorization": f"Bearer {key}"}
msgs = [
    [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    [{"role": "user", "content": [{"type": "text", "text": 5}]}],
    [{"role": "user", "content": None}],
    [{"role": "user"}],
    [{"content": "hi"}],
    [{"role": "wizard", "content": "hi"}],
    [{"role": "user", "content": {"a": 1}}],
    [{"role": "user", "content": 5}],
    [{"role": "assistant", "content": "hi"}],
    [{"role": "system", "content": "x"}],
    [{"role": "user", "content": "hi", "tool_calls": [{"x": 1}]}],
    [{"role": "user", "content": "{% for x in range(10**9) %}{% endfor %}"}],
    [{"role": "user", "content": "a" * 100000}],
]
try:
    for m in msgs:
        for extra in ({}, {"stream": True}):
            r = httpx.post(f"{url}/v1/chat/completions", json={"messages": m, "max_tokens": 2, **extra}, headers=H, timeout=120)
            print(r.status_code, r.text[:160].replace("\n", " "), "<-", json.dumps(m)[:80], extra)
    r = httpx.post(f"{url}/v1/chat/completions", content='{"messages": [{"role": "user", "content": "\\ud800 x"}], "max_tokens": 2}', headers={**H, "Content-Type": "application/json"}, timeout=120)
    print(r.status_code, r.text[:160], "<- lone surrogate")
    r = httpx.post(f"{url}/v1/completions", content='{"prompt": "\\udfff", "max_tokens": 2, "stop": ["\\ud800"]}', headers={**H, "Content-Type": "application/json"}, timeout=120)
    print(r.status_code, r.text[:160], "<- lone surrogate completions")
    print("health", httpx.get(f"{url}/health").status_code)
finally:
    proc.terminate(); proc.wait(60)
log = (tmp / "server.log").read_text()
print([l for l in log.splitlines() if "Error" in l or "Traceback" in l][:20])
