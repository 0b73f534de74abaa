"""Replica loss under load: one engine replica of ``veil serve --replicas N`` killed mid-run.

    python -m veil.benchmarks.cluster_fault [--replicas 2] [--sessions 4] [--completions 4] [--tokens 32]

Split-plain generations (the client SDK, one session each, greedy, EOS ignored) and OpenAI
completions (alternately streamed and not; ``--completion-tokens`` each) run at once. When every
session has taken a few steps and every streamed completion has its first token, the engine
replica holding the most sessions gets SIGKILL (a crash: no shutdown of any kind). The run then
waits for everything to finish and for Ray to bring up a replacement replica, sends new work, and
counts:

* ``sessions``, ``sessions_on_victim``, ``reestablished`` (sessions the SDK re-opened, all
  generations together), ``generations_correct`` (token for token equal to the whole model's
  greedy continuation, computed here);
* ``http_5xx`` (every answer any client saw), ``http_5xx_unexpected`` (all but the 503
  ``replica_lost`` answers to completions sent before the kill: must be 0; the SDK's requests
  never get a 5xx, a step running on the victim answers 404 ``session_not_found``);
* ``completions``, ``completions_ok``, ``completions_failed``, ``completions_failed_on_victim``;
* ``restart_s`` (kill → a new replica healthy), ``after_restart_ok`` / ``after_restart_on_new``
  (completions sent afterwards: all answered, some by the new replica), ``stale_pin_404``
  (a step to a lost session answers 404 ``session_not_found``).

Prints one ``figure cluster_fault.<count> <value>`` line each; JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from veil.benchmarks.cluster import ClusterServer, launch_cluster
from veil.benchmarks.protected_overhead import context_prompt

MODEL = "SmolLM2-135M-Instruct"


class Recorder:
    """Every HTTP answer the clients saw; the 5xx ones that a replica's death does not explain."""

    def __init__(self):
        self.lock = threading.Lock()
        self.statuses: Counter = Counter()
        self.unexpected_5xx: list[str] = []
        self.killed_at: float | None = None

    def answer(self, status: int, what: str, inflight_loss: bool = False) -> None:
        with self.lock:
            self.statuses[status] += 1
            if status >= 500 and not inflight_loss:
                self.unexpected_5xx.append(f"{status} {what}")

    def sent_before_kill(self, sent_at: float) -> bool:
        return self.killed_at is not None and sent_at < self.killed_at

    def hook(self, client: httpx.Client) -> None:
        client.event_hooks["response"].append(lambda r: self.answer(r.status_code, r.request.url.path))


def generation(srv: ClusterServer, half, prompt: list[int], tokens: int, rec: Recorder, out: dict) -> None:
    from veil.client.sdk import VeilClient

    out["replicas"] = []
    with VeilClient(srv.url, srv.key, half=half) as client:
        rec.hook(client.http)
        client.http.event_hooks["response"].append(
            lambda r: r.request.method == "POST" and r.request.url.path.endswith("/steps") and
            out["replicas"].append(r.request.url.path.split("/")[3].split(".")[0]))
        try:
            res = client.generate(prompt, tokens, stop_at_eos=False)
            out["tokens"], out["reestablished"] = res.tokens, res.stats.reestablished
        except Exception as e:  # noqa: BLE001 - counted as a failed generation
            out["error"] = repr(e)


def completion(srv: ClusterServer, prompt: list[int], tokens: int, stream: bool, rec: Recorder, out: dict) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream}
    sent = time.monotonic()
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {srv.key}"}, timeout=600) as c:
        try:
            if not stream:
                r = c.post("/v1/completions", json=body)
                code = r.json().get("error", {}).get("code") if r.status_code != 200 else None
                rec.answer(r.status_code, "/v1/completions", code == "replica_lost" and rec.sent_before_kill(sent))
                out.update(status=r.status_code, replica=r.headers.get("x-veil-replica"), code=code,
                           ok=r.status_code == 200 and r.json()["usage"]["completion_tokens"] == tokens)
                return
            with c.stream("POST", "/v1/completions", json=body) as r:
                rec.answer(r.status_code, "/v1/completions (stream)")
                out.update(status=r.status_code, replica=r.headers.get("x-veil-replica"), pieces=0, done=False)
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        out["done"] = True
                    elif line.startswith("data: "):
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            out["error_event"] = chunk["error"]["code"]
                        else:
                            out["pieces"] += 1
                out["ok"] = out["done"] and r.status_code == 200
        except httpx.HTTPError as e:
            out.update(ok=False, transport_error=repr(e))


def run_fault(srv: ClusterServer, half, expected: list[int], prompt: list[int], sessions: int, completions: int,
              completion_tokens: int, timeout_s: float = 600) -> dict:
    """The run described in the module doc against a running cluster (it ends with one replica
    replaced). ``expected``: the whole model's greedy tokens after ``prompt``."""
    n_replicas = len(srv.running())
    rec = Recorder()
    gens = [{} for _ in range(sessions)]
    comps = [{} for _ in range(completions)]
    threads = [threading.Thread(target=completion, args=(srv, prompt, completion_tokens, i % 2 == 0, rec, c))
               for i, c in enumerate(comps)]
    threads += [threading.Thread(target=generation, args=(srv, half, prompt, len(expected), rec, g)) for g in gens]
    for t in threads:
        t.start()
    # Kill once every session has stepped twice and every streamed completion is streaming.
    deadline = time.monotonic() + timeout_s
    while not (all(len(g.get("replicas", ())) >= 2 for g in gens) and
               all(c.get("pieces", 0) >= 1 for c in comps[::2])):
        if time.monotonic() > deadline:
            raise RuntimeError("the load never got going")
        time.sleep(0.05)
    holders = Counter(g["replicas"][0] for g in gens)
    victim = holders.most_common(1)[0][0]
    rec.killed_at = time.monotonic()
    os.kill(srv.replica_pids()[victim], signal.SIGKILL)
    inflight = [c for c in comps if "ok" not in c]  # completions not yet answered in full
    for t in threads:
        t.join(timeout_s)
    srv.wait_replicas(n_replicas, without=victim)
    restart_s = time.monotonic() - rec.killed_at
    # New work after the restart: balanced over the live replicas, the new one included.
    new = set(srv.running()) - set(holders) - {victim}
    after = [{} for _ in range(8)]  # at once, so the router sees queues and spreads them
    threads = [threading.Thread(target=completion, args=(srv, prompt[:8], 4, False, rec, c)) for c in after]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    lost_sid = f"{victim}.nosuchsession"  # any id pinned to the dead replica
    stale = httpx.post(f"{srv.url}/v1/sessions/{lost_sid}/steps", content=b"x",
                       headers={"Authorization": f"Bearer {srv.key}"}, timeout=30)
    return {
        "replicas": n_replicas, "victim": victim,
        "sessions": sessions, "sessions_on_victim": holders[victim],
        "reestablished": sum(g.get("reestablished", 0) for g in gens),
        "generations_failed": sum("error" in g for g in gens),
        "generations_correct": sum(g.get("tokens") == expected for g in gens),
        "completions": completions, "completions_inflight_at_kill": len(inflight),
        "completions_ok": sum(bool(c.get("ok")) for c in comps),
        "completions_failed": sum(not c.get("ok") for c in comps),
        # a stream names its replica; a lost non-streamed one is the ingress's 503 replica_lost
        "completions_failed_on_victim": sum(not c.get("ok") and (c.get("replica") == victim or
                                                                 c.get("code") == "replica_lost") for c in comps),
        "http_5xx": sum(n for s, n in rec.statuses.items() if s >= 500),
        "http_5xx_unexpected": len(rec.unexpected_5xx), "unexpected_5xx": rec.unexpected_5xx[:5],
        "statuses": {str(k): v for k, v in sorted(rec.statuses.items())},
        "restart_s": restart_s,
        "after_restart_ok": sum(bool(c.get("ok")) for c in after),
        "after_restart_on_new": sum(c.get("replica") in new for c in after),
        "stale_pin_404": int(stale.status_code == 404 and stale.json()["error"]["code"] == "session_not_found"),
        "generation_errors": [g["error"] for g in gens if "error" in g][:3],
        "completion_details": comps,
    }


FIGURES = ("replicas", "sessions", "sessions_on_victim", "reestablished", "generations_failed", "generations_correct",
           "completions", "completions_inflight_at_kill", "completions_ok", "completions_failed",
           "completions_failed_on_victim", "http_5xx", "http_5xx_unexpected", "restart_s", "after_restart_ok",
           "after_restart_on_new", "stale_pin_404")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--completions", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32, help="tokens each split generation makes")
    p.add_argument("--completion-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--kv-cache-gb", type=float, default=0.125, help="each replica's KV pool")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)

    from veil.engine.generate import generate_local
    from veil.engine.loader import build_model, load_checkpoint
    from veil.engine.split import client_half_from

    ckpt = load_checkpoint()
    prompt = context_prompt(ckpt.tokenizer, args.prompt_tokens)
    expected = generate_local(build_model(ckpt), prompt, args.tokens)
    half = client_half_from(ckpt, 2)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"starting `veil serve --replicas {args.replicas}`…", file=sys.stderr, flush=True)
        srv = launch_cluster(Path(tmp), args.replicas, ("plaintext",), ["--kv-cache-gb", str(args.kv_cache_gb)])
        try:
            res = run_fault(srv, half, expected, prompt, args.sessions, args.completions, args.completion_tokens)
        finally:
            srv.stop()
    for name in FIGURES:
        print(f"figure cluster_fault.{name} {res[name]:.6g}", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
