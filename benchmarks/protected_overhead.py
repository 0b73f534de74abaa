"""What privacy costs on the split path: plaintext split against protected (CKKS) split.

    python -m veil.benchmarks.protected_overhead          # the must-show case: k=2, context 64, 8 tokens
    veil bench --paths split-plain,protected [--k 28] [--contexts 16,64,128] [--max-new-tokens 8]

A `veil serve` subprocess on loopback serves both paths (one tenant with both scopes); this
process is the client SDK. For each context length C: a prompt of exactly C tokens (a fixed
text), then ``--max-new-tokens`` greedy tokens, one session per (path, context).

Figures (per path and context):
* ``ttft_s``: session open → first token (the whole prompt's prefill; protected prefill runs
  position by position, multi-token packing is not implemented). The server encodes its
  protected weights when its first protected session opens, once per process: a session opened
  and closed before the timed ones takes that (``setup.server_protected_warmup_s`` in the JSON;
  runs before 2026-11-27 counted it in the first context's TTFT). The first context's prompt
  still grows the server's heap (k=28, 8 tokens: 12.2 s, the next prompts 6.2-6.4 s;
  benchmarks/results/2026-12-07-first-prompt): repeat a context (``--contexts 8,8``) for a warm
  server's TTFT, which the JSON keeps (the last run of a context);
* ``tpot_s`` / ``itl_s``: gaps between consecutive tokens (one decode step each);
* ``bytes_up_per_token`` / ``bytes_down_per_token`` / ``bytes_per_token``,
  ``round_trips_per_token``, ``client_cpu_s_per_token``: over the decode steps only;
* ``bytes_per_token_by_kind.<up|down>.<kind>`` (protected): the decode bytes per token by
  message kind and direction (HTTP bodies: token, weights, mlp_in, refreshed up; scores, mlp,
  refresh, final down), so a change to the wire shows where its bytes went;
* ``setup_bytes``: the evaluation keys (protected; uploaded once per client): ``--keys`` picks
  the set, ``auto`` (default) the one the server's /health prefers, as the SDK does: compact
  on SEAL (baby steps chained from step 1 on the server), full on native;
* ``server_s.<op>`` (protected): server HE seconds per decode token by operation kind, read from
  the server's Prometheus counter ``veil_protected_op_seconds``; ``ttft_server_s.<op>`` the same
  for the prompt's prefill, and ``ttft_client_cpu_s`` the client's CPU seconds in it (what is
  left of ``ttft_s`` is the wire, the (de)serialization outside the HE sections, and waiting);
* ``server_peak_rss_bytes`` (VmHWM of the server process), ``client_peak_rss_bytes``;
* ``kl_mean`` / ``greedy_agreement``: the client's next-token distributions against the plaintext
  model on the same token prefix (teacher-forced on the path's own tokens), over every
  generated position.
JSON (``--out``) and one ``figure …`` line per figure.
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from veil.benchmarks.stats import distribution, emit, figure_lines

PATH_MODES = {"split-plain": "plaintext", "protected": "protected"}
TEXT = ("Veil runs the protected layers of a language model on encrypted activations. The server never "
        "sees the prompt, the hidden states or the output, and the client never sees the weights. ") * 40


def context_prompt(tokenizer, ctx: int) -> list[int]:
    ids = tokenizer(TEXT)["input_ids"][:ctx]
    if len(ids) != ctx:
        raise ValueError(f"context {ctx} exceeds the benchmark text ({len(ids)} tokens)")
    return ids


def save_workload(path, context: int = 64, new_tokens: int = 8) -> None:
    """This benchmark's workload (the prompt of ``context`` tokens, ``new_tokens`` greedy tokens)
    as a workload JSON, for peers that run in another virtual environment."""
    from veil.benchmarks.workload import BenchRequest, Workload
    from veil.engine.loader import default_gguf_path, load_tokenizer

    gguf = default_gguf_path()
    prompt = context_prompt(load_tokenizer(gguf.parent, gguf.name), context)
    Workload([BenchRequest(prompt, new_tokens)], 0,
             f"protected_overhead: context {context}, {new_tokens} new tokens").to_json(path)


def start_split_server(tmp: Path, k: int, extra: list[str] | None = None) -> tuple[subprocess.Popen, str, str]:
    """A `veil serve --k K` subprocess with one tenant holding both scopes."""
    from veil.benchmarks.engine_throughput import launch_server

    return launch_server(tmp, ("plaintext", "protected"), ["--k", str(k), "--session-ttl", "86400", *(extra or [])])


def peak_rss(pid: int) -> int:
    """VmHWM (peak resident set) of a process, in bytes (Linux)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def server_op_seconds(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {m[1]: float(m[2]) for m in re.finditer(r'veil_protected_op_seconds_total\{op="(\w+)"\} ([0-9.e+-]+)', text)}


def kl_and_agreement(ref_logits: torch.Tensor, logits: torch.Tensor) -> tuple[list[float], list[bool]]:
    """KL(reference || path) per position, and whether the argmaxes agree."""
    lp = torch.log_softmax(ref_logits.double(), -1)
    lq = torch.log_softmax(logits.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    return kl.tolist(), (ref_logits.argmax(-1) == logits.argmax(-1)).tolist()


def logits_of(model):
    """``ids -> logits at every position`` of the plaintext model (a ``LlamaModel`` with its
    ends, or `transformers`' ``LlamaForCausalLM``)."""

    def run(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            x = torch.tensor(ids)
            if hasattr(model, "forward_layers"):
                h, _ = model.forward_layers(model.embed(x), torch.arange(len(ids)), [None] * len(model.layers))
                return model.logits(h).float()
            return model(x[None]).logits[0].float()

    return run


def warm_up_protected(client) -> float:
    """Open and close one protected session; returns its seconds. The server encodes its
    protected weights when its first protected session opens (once per process): a benchmark
    calls this first, so that no measured session's TTFT carries it."""
    t = time.perf_counter()
    client.open_session().close()
    return time.perf_counter() - t


def run_session(client, prompt: list[int], new_tokens: int, reference_logits, url: str | None = None) -> dict:
    """One session: prefill ``prompt``, decode ``new_tokens`` greedily; the figures above."""
    from veil.client.sdk import GenerationStats

    stats = GenerationStats(prompt_tokens=len(prompt))
    protected = client.mode == "protected"
    if protected:
        client.ensure_keys()
    ops_open = server_op_seconds(url) if protected and url else {}
    t0 = time.perf_counter()
    session = client.open_session(stats)
    try:
        logits = [session.forward(prompt, stats)]
        times = [time.perf_counter()]
        prefill = (stats.bytes_up, stats.bytes_down, stats.round_trips, stats.client_cpu_s)
        prefill_by_kind = dict(stats.bytes_by_kind)
        ops0 = server_op_seconds(url) if protected and url else {}
        tokens = [int(logits[-1].argmax())]
        while len(tokens) < new_tokens:
            logits.append(session.forward([tokens[-1]], stats))
            times.append(time.perf_counter())
            tokens.append(int(logits[-1].argmax()))
        ops1 = server_op_seconds(url) if protected and url else {}
    finally:
        session.close()
    n = max(1, new_tokens - 1)  # decode steps
    ref = reference_logits(prompt + tokens[:-1])[len(prompt) - 1:]
    kl, agree = kl_and_agreement(ref, torch.stack(logits))
    gaps = [b - a for a, b in zip(times[:-1], times[1:], strict=True)]
    up, down = stats.bytes_up - prefill[0], stats.bytes_down - prefill[1]
    out = {
        "context": len(prompt), "new_tokens": new_tokens, "tokens": tokens,
        "ttft_s": times[0] - t0, "tpot_s": distribution(gaps), "itl_s": distribution(gaps),
        "e2el_s": times[-1] - t0,
        "bytes_up_per_token": up / n, "bytes_down_per_token": down / n, "bytes_per_token": (up + down) / n,
        "bytes_per_token_by_kind": {kind: (b - prefill_by_kind.get(kind, 0)) / n
                                    for kind, b in sorted(stats.bytes_by_kind.items())},
        "prefill_bytes": prefill[0] + prefill[1], "prefill_round_trips": prefill[2],
        "round_trips_per_token": (stats.round_trips - prefill[2]) / n,
        "client_cpu_s_per_token": (stats.client_cpu_s - prefill[3]) / n,
        "setup_bytes": client.setup_bytes if protected else 0,
        "kl_mean": sum(kl) / len(kl), "kl_max": max(kl), "greedy_agreement": sum(agree) / len(agree),
    }
    if protected and url:
        out["server_s"] = {op: (ops1.get(op, 0.0) - ops0.get(op, 0.0)) / n for op in sorted(set(ops0) | set(ops1))}
        out["ttft_server_s"] = {op: ops0.get(op, 0.0) - ops_open.get(op, 0.0) for op in sorted(set(ops0) | set(ops_open))}
        out["ttft_client_cpu_s"] = prefill[3]
    return out


#: result fields that are not figures
NOT_FIGURES = ("tokens", "context", "new_tokens", "requests")


def measure_split_paths(paths: list[str], k: int, contexts: list[int], new_tokens: int, ckpt=None,
                        progress=print, reference_logits=None, server_args: list[str] | None = None,
                        prefill_span: int | None = None, he_backend: str = "seal",
                        key_set: str | None = None) -> dict:
    """Run every (path, context) against one server subprocess; returns results by path. The
    protected path runs ``he_backend`` on both ends, with the evaluation keys ``key_set``
    (``key_levels.KEY_SETS``; None: the set the server prefers)."""
    from veil.client.sdk import VeilClient
    from veil.engine.loader import build_model, load_checkpoint
    from veil.engine.split import client_half_from
    from veil.protected.protocol import MAX_SPAN

    ckpt = ckpt or load_checkpoint()
    reference_logits = reference_logits or logits_of(build_model(ckpt))
    half = client_half_from(ckpt, k)
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, key = start_split_server(Path(tmp), k, [*(server_args or []), "--he-backend", he_backend])
        try:
            for path in paths:
                mode = PATH_MODES[path]
                with VeilClient(url, key, mode=mode, half=half, timeout_s=3600, he_backend=he_backend,
                                prefill_span=prefill_span or MAX_SPAN, key_set=key_set) as client:
                    if mode == "protected":
                        t = time.perf_counter()
                        client.generate_keys()
                        client.ensure_keys()
                        setup = results.setdefault("setup", {})
                        setup["protected_keygen_and_upload_s"] = time.perf_counter() - t
                        setup["protected_key_set"] = client.key_set
                        setup["server_protected_warmup_s"] = warm_up_protected(client)
                    for ctx in contexts:
                        progress(f"{path}: context {ctx}, {new_tokens} new tokens (k={k}, "
                                 f"{ckpt.config.num_layers - k} server layers)…")
                        r = run_session(client, context_prompt(ckpt.tokenizer, ctx), new_tokens, reference_logits, url)
                        results.setdefault(path, {})[f"ctx{ctx}"] = r
                        progress(f"  TTFT {r['ttft_s']:.2f} s, TPOT {r['tpot_s']['mean']:.3f} s, "
                                 f"{r['bytes_per_token'] / 1e6:.2f} MB/token, KL {r['kl_mean']:.2e}")
            results["server_peak_rss_bytes"] = peak_rss(proc.pid)
        finally:
            proc.terminate()
            proc.wait(60)
    results["client_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return results


def main(argv: list[str] | None = None) -> int:
    from veil.benchmarks.engine_throughput import machine_facts
    from veil.crypto.params import PROTECTED_PARAMS
    from veil.protected.key_levels import KEY_SETS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paths", default="split-plain,protected")
    p.add_argument("--k", type=int, default=2, help="split point: the server runs layers [k, L)")
    p.add_argument("--contexts", default="64")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--server-kv-cache-gb", type=float, default=0.25,
                   help="the server's plaintext paged KV pool (veil serve --kv-cache-gb; default 2): only "
                        "the split-plain runs use it (a few hundred tokens need ~15 MB). On CPU the pool "
                        "is resident only where written, so this mostly bounds address space; kept at "
                        "0.25 so that figures stay comparable with runs from before that change")
    p.add_argument("--prefill-span", type=int, default=None,
                   help="protected: prompt positions per round trip (default and most: veil.crypto.wire.MAX_SPAN)")
    p.add_argument("--he-backend", default="seal", help="the protected path's HE backend, on both ends")
    p.add_argument("--keys", choices=["auto", *KEY_SETS], default="auto",
                   help="protected: the evaluation-key set the client makes (key_levels.rotation_key_levels); "
                        "auto: the one the server's /health prefers, as the SDK does")
    p.add_argument("--out", type=Path, default=Path("bench_out/protected_overhead.json"))
    args = p.parse_args(argv)
    paths = [x for x in args.paths.split(",") if x]
    unknown = set(paths) - set(PATH_MODES)
    if unknown:
        p.error(f"unknown paths {sorted(unknown)}; choose from {sorted(PATH_MODES)}")
    contexts = [int(c) for c in args.contexts.split(",")]
    res = measure_split_paths(paths, args.k, contexts, args.max_new_tokens,
                              progress=lambda m: print(m, file=sys.stderr, flush=True),
                              server_args=["--kv-cache-gb", str(args.server_kv_cache_gb)],
                              prefill_span=args.prefill_span, he_backend=args.he_backend,
                              key_set=None if args.keys == "auto" else args.keys)
    results = {"schema": "veil.protected_overhead/1", "machine": machine_facts(), "k": args.k,
               "prefill_span": args.prefill_span, "he_backend": args.he_backend, "keys": args.keys,
               "param_set": PROTECTED_PARAMS.id, "paths": {p_: res[p_] for p_ in paths if p_ in res},
               "server_peak_rss_bytes": res["server_peak_rss_bytes"],
               "server_kv_cache_gb": args.server_kv_cache_gb,
               "client_peak_rss_bytes": res["client_peak_rss_bytes"], "setup": res.get("setup", {})}
    lines = []
    for path in paths:
        for tag, r in res.get(path, {}).items():
            lines += figure_lines(path, r, f".{tag}", skip=NOT_FIGURES)
    lines += figure_lines("protected.setup", res.get("setup", {}))  # key generation, upload, warm-up
    lines.append(f"figure split.server_peak_rss_bytes {res['server_peak_rss_bytes']}")
    lines.append(f"figure split.client_peak_rss_bytes {res['client_peak_rss_bytes']}")
    from veil.benchmarks.overhead import ratios

    results["ratios"] = ratios(results["paths"])
    lines += [f"figure ratio.{name} {v:.6g}" for name, v in results["ratios"].items()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    emit(lines, results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
