"""Load and soak: many concurrent plaintext split sessions against a `veil serve` subprocess for a
fixed time; errors counted, server memory watched.

    python -m veil.benchmarks.load_soak                        # 64 sessions for 10 minutes
    python -m veil.benchmarks.load_soak --sessions 8 --duration 20

Each of ``--sessions`` workers loops: open a session, send a prefill step of P random hidden
states (P uniform in 16..128), then D single-token decode steps (D uniform in 8..64), each the
real msgpack step on the real HTTP API, then DELETE the session. The hidden states are random
vectors of the right shape instead of a client's layer-k output: the server's work (layers
[k, L), KV cache, batching) is the same, and the load generator stays light enough to keep 64
sessions in flight on this 2-core machine. An error is any non-2xx answer, a reply of the wrong
shape, or a transport failure.

With ``--bad-every N``, every N-th step of a worker is preceded by one message a client should
not send, in turn: bytes that are not a message (400), a spent step id with another body (409),
another session's id in the URL (404), and the last step sent again byte for byte (200, the reply
it got, as after a lost reply). Any other answer is an error; the session then goes on.

Server RSS (``/proc/<pid>/status`` VmRSS) is sampled every second: start (after warm-up), peak,
end. Prints one ``figure soak.<metric> <value>`` line per figure and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from veil.benchmarks.engine_throughput import launch_server
from veil.crypto.wire import CONTENT_TYPE, HiddenReply, HiddenStep


def rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def bad_message(client: httpx.AsyncClient, sid: str, kind: int, last: tuple[bytes, bytes] | None,
                      step: int, hidden: int, pos: int) -> str | None:
    """Send one message of ``kind`` (0-3, the docstring's order) to a session whose last step,
    ``step``, was ``last`` (its body and reply); what went wrong, or None."""
    url, headers = f"/v1/sessions/{sid}/steps", {"Content-Type": CONTENT_TYPE}
    if kind == 3 and last is not None:  # the last step again: the reply it got
        r = await client.post(url, content=last[0], headers=headers)
        return None if r.status_code == 200 and r.content == last[1] else f"resent {r.status_code}"
    if kind == 1 and last is not None:  # its step id, spent, with another body
        body = HiddenStep(sid, step, torch.zeros(1, hidden), [pos]).to_bytes()
        want = 409
    elif kind == 2:
        url, body, want = f"/v1/sessions/{secrets.token_urlsafe(24)}/steps", last[0] if last else b"x", 404
    else:
        body, want = secrets.token_bytes(64), 400
    r = await client.post(url, content=body, headers=headers)
    return None if r.status_code == want else f"bad message {kind}: {r.status_code} (wanted {want})"


async def worker(client: httpx.AsyncClient, wid: int, stop_at: float, stats: dict, bad_every: int = 0) -> None:
    rng = random.Random(wid)
    while time.monotonic() < stop_at:
        sid = None
        try:
            r = await client.post("/v1/sessions", json={"path": "plaintext"})
            if r.status_code != 201:
                stats["errors"].append(f"create {r.status_code}: {r.text[:120]}")
                await asyncio.sleep(0.5)
                continue
            sid, hidden = r.json()["id"], r.json()["hidden_size"]
            pos, step, last = 0, 0, None
            for n in [rng.randint(16, 128)] + [1] * rng.randint(8, 64):
                if time.monotonic() >= stop_at:
                    break
                if bad_every and rng.randrange(bad_every) == 0:
                    stats["bad_sent"] += 1
                    if wrong := await bad_message(client, sid, stats["bad_sent"] % 4, last, step, hidden, pos):
                        stats["errors"].append(wrong)
                step += 1
                h = torch.randn(n, hidden) * 0.5
                body = HiddenStep(sid, step, h, list(range(pos, pos + n))).to_bytes()
                r = await client.post(f"/v1/sessions/{sid}/steps", content=body, headers={"Content-Type": CONTENT_TYPE})
                if r.status_code != 200:
                    stats["errors"].append(f"step {r.status_code}: {r.text[:120]}")
                    break
                reply = HiddenReply.from_bytes(r.content)
                if tuple(reply.hidden.shape) != (n, hidden) or not torch.isfinite(reply.hidden).all():
                    stats["errors"].append("bad reply")
                    break
                pos, last = pos + n, (body, r.content)
                stats["steps"] += 1
                stats["tokens"] += n
            stats["sessions"] += 1
        except (httpx.HTTPError, ValueError) as e:
            stats["errors"].append(f"{type(e).__name__}: {e}")
        finally:
            if sid is not None:
                try:
                    await client.delete(f"/v1/sessions/{sid}")
                except httpx.HTTPError as e:
                    stats["errors"].append(f"delete {type(e).__name__}")


async def run(url: str, key: str, sessions: int, duration: float, pid: int, bad_every: int = 0) -> dict:
    stats = {"errors": [], "steps": 0, "tokens": 0, "sessions": 0, "bad_sent": 0}
    limits = httpx.Limits(max_connections=sessions + 4, max_keepalive_connections=sessions + 4)
    samples: list[tuple[float, int]] = []
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=600,
                                 limits=limits) as client:
        t0 = time.monotonic()
        stop_at = t0 + duration

        async def sampler():
            while time.monotonic() < stop_at + 1:
                samples.append((time.monotonic() - t0, rss(pid)))
                await asyncio.sleep(1.0)

        tasks = [asyncio.create_task(worker(client, i, stop_at, stats, bad_every)) for i in range(sessions)]
        s = asyncio.create_task(sampler())
        await asyncio.gather(*tasks)
        await s
        elapsed = time.monotonic() - t0
        metrics = (await client.get("/metrics")).text
    open_sessions = next((float(ln.split()[-1]) for ln in metrics.splitlines() if ln.startswith("veil_sessions ")), -1)
    values = [r for _, r in samples]
    return {"sessions": sessions, "duration_s": elapsed, "errors": len(stats["errors"]),
            "error_examples": stats["errors"][:5], "steps": stats["steps"], "tokens": stats["tokens"],
            "sessions_completed": stats["sessions"], "steps_per_s": stats["steps"] / elapsed,
            "bad_messages": stats["bad_sent"],
            "server_rss_start_bytes": values[0] if values else 0, "server_rss_peak_bytes": max(values, default=0),
            "server_rss_end_bytes": rss(pid), "open_sessions_after": open_sessions,
            "rss_samples": samples[:: max(1, len(samples) // 60)]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=64)
    p.add_argument("--duration", type=float, default=600.0, help="seconds")
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--kv-cache-gb", type=float, default=1.0)
    p.add_argument("--bad-every", type=int, default=0,
                   help="about one step in N is preceded by a message a client should not send (0: none)")
    p.add_argument("--out", type=Path, default=Path("bench_out/load_soak.json"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, key = launch_server(Path(tmp), ("plaintext",), ["--k", str(args.k), "--kv-cache-gb",
                                                                    str(args.kv_cache_gb)])
        try:
            res = asyncio.run(run(url, key, args.sessions, args.duration, proc.pid, args.bad_every))
            alive = proc.poll() is None and httpx.get(f"{url}/health").status_code == 200
        finally:
            proc.terminate()
            proc.wait(60)
    res["server_alive_after"] = alive
    for k in ("sessions", "duration_s", "errors", "steps", "tokens", "sessions_completed", "steps_per_s", "bad_messages",
              "server_rss_start_bytes", "server_rss_peak_bytes", "server_rss_end_bytes", "open_sessions_after"):
        print(f"figure soak.{k} {float(res[k]):.6g}", flush=True)
    for e in res["error_examples"]:
        print(f"# error: {e}", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2))
    return 0 if res["errors"] == 0 and alive else 1


if __name__ == "__main__":
    sys.exit(main())
