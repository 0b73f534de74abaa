"""The overhead report: every path measured in one run, with plots, goodput and methodology.

    veil bench --paths reference,fast,split-plain,protected --out DIR [--contexts 16,64,128]
               [--concurrency 1,4,16,64] [--max-new-tokens N] [--k K]
               [--slo-ttft-ms X --slo-tpot-ms Y] [--replicas single,1,2] [--quick]
               [--peer PEER.json ...] [--from EARLIER.json] [--extraction ATTACK.json]

Paths:
* ``reference``: `transformers` ``LlamaForCausalLM.generate`` on the full model, local, greedy;
* ``fast``: the OpenAI-compatible full-model endpoint (streamed ``/v1/completions``);
* ``split-plain``: the client SDK, plaintext split (layers [0, k) here, [k, L) on the server);
* ``protected``: the client SDK, CKKS split (docs/PROTOCOL.md).

One ``veil serve --k K`` subprocess on loopback serves fast, split-plain and protected. With
``--replicas N,M…`` the server paths run against ``veil serve --replicas N`` (Ray Serve, the
``cluster`` extra), then ``--replicas M``…, and are named ``PATH@rN``; ``single`` in the list is
the one-process server. Their server RSS is summed over the server's process tree (Ray's
processes included), and ``ratio.PATH@rN_over_PATH@rM.output_tok_s.cC`` is the scaling.

Client and server share the machine, so the cores are split between the two processes
(``--server-threads``, ``--client-threads``; by default half each, at least one: on the 2-core
development machine one and one) and ``settings.threads`` records the split. Left to torch's
defaults both would start a thread per core and starve each other (the split-plain SDK at k=29
once measured 726 ms per token that way, 70 ms with one client thread). The reference runs
before the server starts, with every core.

Per path and context C (a prompt of exactly C tokens, then N greedy tokens, one request at a
time): TTFT, TPOT, ITL, end-to-end latency (mean/p50/p95/p99 over the decode steps or
requests), bytes up/down per token and setup bytes, round trips per token, client CPU s/token,
the protected server's HE time by operation kind, mean KL of the next-token distribution against
``reference`` and greedy agreement. Per path and concurrency c (fast, split-plain): output tok/s,
requests/s and goodput (requests/s meeting both SLOs) for ``4c`` requests with at most c in
flight. Peak RSS of the server and of this client process after each path.

Outputs in DIR (``--out``):
* ``results.json`` — schema ``veil.bench/1``::

    {"schema": "veil.bench/1", "interrupted": bool, "settings": {...}, "machine": {...},
     "paths": {PATH: {"ctxC": {METRIC: number | {"mean","p50","p95","p99"} | {op: s}},
                      "cC": {"output_tok_s", "requests_s", "goodput_rps", "ttft_s", ...},
                      "server_peak_rss_bytes": int, "client_peak_rss_bytes": int}},
     "ratios": {"protected_over_split_plain.tpot_s.ctxC": x, "split_plain_over_fast.tpot_s.ctxC": x, ...}}

* ``report.md`` — a table per figure, the overhead ratios and how to read them;
* ``tpot_vs_context.png``, ``bytes_per_token.png``, ``round_trips_per_token.png``,
  ``throughput_vs_concurrency.png``, ``protected_server_breakdown.png``.

Every figure is also printed as a ``figure <path>.<metric>[.<stat>][.ctxC|.cC] <value>`` line.
Ctrl-C stops the run and writes what was measured so far (``"interrupted": true``).

``--peer`` adds a peer's result measured on the same workload in its own venv (e.g.
``benchmarks/peers/concrete_ml_hybrid.py``; ``veil.benchmarks.peer_results``) as rows of every
table and plot, with ``ratio.<peer>_over_protected.*``; ``--from`` takes Veil's rows from an
earlier run instead of measuring them; ``--extraction`` adds the weight-extraction attack's
result (``veil.benchmarks.extraction_attack``) to the report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from veil.benchmarks.protected_overhead import (
    NOT_FIGURES,
    PATH_MODES,
    context_prompt,
    logits_of,
    peak_rss,
    run_session,
    start_split_server,
    warm_up_protected,
)
from veil.benchmarks.stats import RequestRecord, distribution, figure_lines, summarize

SCHEMA = "veil.bench/1"
ALL_PATHS = ("reference", "fast", "split-plain", "protected")


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- reference ------------------------------------------------------------------------------
def run_reference_context(hf_model, prompt: list[int], new_tokens: int) -> dict:
    """One greedy `generate` call (EOS disabled, exact length), timed by a streamer exactly as
    the engine benchmark's reference does (``reference_hf``). The reference is the baseline of
    every KL and agreement figure, so it reports none of its own."""
    from veil.benchmarks.reference_hf import _generation_config, _NoEos, _StepClock

    clock = _StepClock()
    with _NoEos(hf_model), torch.inference_mode():
        t0 = time.perf_counter()
        out = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                generation_config=_generation_config(hf_model, new_tokens, 0), streamer=clock)
    tokens = out[0, len(prompt):].tolist()
    if len(tokens) != new_tokens:
        raise RuntimeError(f"reference produced {len(tokens)} tokens, expected {new_tokens}")
    tok_times = clock.times[1:]  # times[0]: the prompt handed to the streamer
    gaps = [b - a for a, b in zip(tok_times[:-1], tok_times[1:], strict=True)]
    return {"context": len(prompt), "tokens": tokens, "ttft_s": tok_times[0] - t0, "tpot_s": distribution(gaps),
            "itl_s": distribution(gaps), "e2el_s": tok_times[-1] - t0}


# ---- fast -----------------------------------------------------------------------------------
def run_fast_context(url: str, key: str, prompt: list[int], new_tokens: int, ref_tokens: list[int], tokenizer) -> dict:
    """One streamed /v1/completions request alone; latencies as the engine benchmark defines them."""
    from veil.benchmarks.engine_throughput import run_fast
    from veil.benchmarks.workload import BenchRequest, Workload

    wl = Workload([BenchRequest(prompt, new_tokens)], 0, "single request")
    records, _ = asyncio.run(run_fast(url, key, wl, 1, float("inf"), "SmolLM2-135M-Instruct"))
    r = records[0]
    if r.error:
        raise RuntimeError(f"fast path: {r.error}")
    text = _completion_text(url, key, prompt, new_tokens)
    agree = text == tokenizer.decode(ref_tokens, skip_special_tokens=True)
    return {"context": len(prompt), "ttft_s": r.ttft, "tpot_s": distribution(r.itl), "itl_s": distribution(r.itl),
            "e2el_s": r.e2el, "greedy_agreement": float(agree)}


def _completion_text(url: str, key: str, prompt: list[int], new_tokens: int) -> str:
    import httpx

    r = httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=600,
                   json={"model": "SmolLM2-135M-Instruct", "prompt": prompt, "max_tokens": new_tokens,
                         "temperature": 0, "ignore_eos": True})
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def fast_concurrency(url: str, key: str, c: int, prompt_len: int, new_tokens: int, slo) -> dict:
    from veil.benchmarks.engine_throughput import run_fast
    from veil.benchmarks.workload import random_workload

    wl = random_workload(4 * c, (prompt_len, prompt_len), (new_tokens, new_tokens), seed=c)
    records, duration = asyncio.run(run_fast(url, key, wl, c, float("inf"), "SmolLM2-135M-Instruct"))
    return summarize(records, duration, *slo)


# ---- split-plain under concurrency ----------------------------------------------------------
def split_concurrency(url: str, key: str, half, c: int, prompt: list[int], new_tokens: int, slo,
                      torch_threads: int | None = None) -> dict:
    """``4c`` split-plain generations, ``c`` client threads at a time (one SDK client each)."""
    from veil.client.sdk import VeilClient

    records = [RequestRecord(arrival=0.0, prompt_tokens=len(prompt)) for _ in range(4 * c)]
    queue = list(records)
    lock = threading.Lock()

    def worker():
        with VeilClient(url, key, mode="plaintext", half=half, threads=torch_threads) as client:
            while True:
                with lock:
                    if not queue:
                        return
                    rec = queue.pop()
                rec.arrival = time.perf_counter()
                try:
                    last = None
                    for _ in client.iter_tokens(prompt, new_tokens, stop_at_eos=False):
                        now = time.perf_counter()
                        if rec.first_token is None:
                            rec.first_token = now
                        else:
                            rec.itl.append(now - last)
                        last = now
                        rec.output_tokens += 1
                    rec.end = last
                except Exception as e:  # noqa: BLE001 - recorded as the request's error
                    rec.error = repr(e)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summarize(records, time.perf_counter() - t0, *slo)


# ---- the run --------------------------------------------------------------------------------
def machine(k: int) -> dict:
    import tenseal

    from veil.benchmarks.engine_throughput import machine_facts
    from veil.crypto.params import PROTECTED_PARAMS

    return {**machine_facts(), "tenseal": tenseal.__version__, "param_set": PROTECTED_PARAMS.id, "k": k}


def measure(args, results: dict) -> None:
    """Fill ``results`` in place (so an interrupt keeps what is done)."""
    from tqdm.auto import tqdm

    from veil.engine.loader import load_checkpoint
    from veil.engine.reference import build_reference
    from veil.engine.split import client_half_from

    paths, contexts, n = args.paths, args.contexts, args.max_new_tokens
    say("loading the model…")
    ckpt = load_checkpoint()
    hf = build_reference(ckpt)
    reference_logits = logits_of(hf)  # every path's KL is against transformers' model
    prompts = {c: context_prompt(ckpt.tokenizer, c) for c in contexts}
    P = results["paths"]
    ref_tokens = {}
    # the reference tokens are needed for the fast path's agreement even when not reported
    for c in tqdm(contexts, desc="reference", disable=not args.progress):
        r = run_reference_context(hf, prompts[c], n)
        ref_tokens[c] = r["tokens"]
        if "reference" in paths:
            P.setdefault("reference", {})[f"ctx{c}"] = r
    if "reference" in paths:
        P["reference"]["client_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if not set(paths) & {"fast", "split-plain", "protected"}:
        return
    half = client_half_from(ckpt, args.k)
    threads = results["settings"]["threads"]
    torch.set_num_threads(threads["client"])
    for replicas in args.replicas:
        measure_server(args, P, replicas, half, ckpt, prompts, ref_tokens, reference_logits, threads)


def start_server(tmp: Path, k: int, replicas: int | None, extra: list[str]):
    """``veil serve --k K`` on loopback, one process or ``--replicas N`` on Ray Serve; returns
    (process, url, key, its peak RSS as a function, stop)."""
    if replicas is None:
        proc, url, key = start_split_server(tmp, k, extra)

        def stop():
            proc.terminate()
            proc.wait(60)

        return proc, url, key, lambda: peak_rss(proc.pid), stop
    from veil.benchmarks.cluster import launch_cluster, tree_peak_rss

    srv = launch_cluster(tmp, replicas, ("plaintext", "protected"), ["--k", str(k), "--session-ttl", "86400"])
    return srv.proc, srv.url, srv.key, lambda: tree_peak_rss(srv.proc.pid), srv.stop


def measure_server(args, P: dict, replicas: int | None, half, ckpt, prompts, ref_tokens, reference_logits,
                   threads: dict) -> None:
    """The server paths against one server: ``veil serve`` (named as the path) or ``veil serve
    --replicas N`` (the path named ``PATH@rN``; Ray sets each replica's threads)."""
    from tqdm.auto import tqdm

    from veil.client.sdk import VeilClient

    paths, contexts, conc, n = args.paths, args.contexts, args.concurrency, args.max_new_tokens
    slo = (args.slo_ttft_ms / 1000 if args.slo_ttft_ms else None, args.slo_tpot_ms / 1000 if args.slo_tpot_ms else None)
    suffix = "" if replicas is None else f"@r{replicas}"
    with tempfile.TemporaryDirectory() as tmp:
        say(f"starting `veil serve --k {args.k}" + (f" --replicas {replicas}" if replicas else
                                                     f" --device {args.device} --threads {threads['server']}")
            + f"` on loopback (client: {threads['client']} torch threads)…")
        proc, url, key, server_rss, stop = start_server(Path(tmp), args.k, replicas,
                                                        ["--device", args.device, "--threads", str(threads["server"])])
        try:
            if "fast" in paths:
                fast = P.setdefault("fast" + suffix, {})
                _completion_text(url, key, [1, 2, 3, 4], 2)  # warm-up (first-call allocations)
                for c in tqdm(contexts, desc=f"fast{suffix}: contexts", disable=not args.progress):
                    fast[f"ctx{c}"] = run_fast_context(url, key, prompts[c], n, ref_tokens[c], ckpt.tokenizer)
                for c in tqdm(conc, desc=f"fast{suffix}: concurrency", disable=not args.progress):
                    fast[f"c{c}"] = fast_concurrency(url, key, c, args.concurrency_prompt, n, slo)
                fast["server_peak_rss_bytes"] = server_rss()
            for path in [p for p in ("split-plain", "protected") if p in paths]:
                mode, R = PATH_MODES[path], P.setdefault(path + suffix, {})
                with VeilClient(url, key, mode=mode, half=half, timeout_s=7200, threads=threads["client"]) as client:
                    if mode == "protected":
                        say("protected: key generation and upload (setup, reported separately)…")
                        t = time.perf_counter()
                        client.generate_keys(progress=args.progress)
                        client.ensure_keys()
                        R["setup_s"] = time.perf_counter() - t
                        R["server_protected_warmup_s"] = warm_up_protected(client)
                    for c in tqdm(contexts, desc=f"{path}{suffix}: contexts", disable=not args.progress):
                        R[f"ctx{c}"] = run_session(client, prompts[c], n, reference_logits, url)
                if path == "split-plain":
                    for c in tqdm(conc, desc=f"split-plain{suffix}: concurrency", disable=not args.progress):
                        R[f"c{c}"] = split_concurrency(url, key, half, c,
                                                       context_prompt(ckpt.tokenizer, args.concurrency_prompt),
                                                       n, slo, threads["client"])
                R["server_peak_rss_bytes"] = server_rss()
                R["client_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        finally:
            stop()


def ratios(paths: dict, partial: tuple[str, ...] = ()) -> dict:
    """Ratios of one path's figures over another's at the same context; ``partial`` names peer
    rows that ran only some of the server's layers (no ratio to Veil's full split for them)."""
    out = replica_ratios(paths)
    pairs = [("protected", "split-plain", "protected_over_split_plain"), ("split-plain", "fast", "split_plain_over_fast"),
             ("fast", "reference", "fast_over_reference")]
    pairs += [(p, "protected", f"{p}_over_protected") for p in paths
              if p not in ALL_PATHS and p not in partial and "@r" not in p]
    for a, b, name in pairs:
        if a not in paths or b not in paths:
            continue
        for tag, ra in paths[a].items():
            rb = paths[b].get(tag)
            if not tag.startswith("ctx") or not isinstance(rb, dict):
                continue
            for metric in ("tpot_s", "ttft_s", "bytes_per_token"):
                va, vb = _scalar(ra.get(metric)), _scalar(rb.get(metric))
                if va is not None and vb:
                    out[f"{name}.{metric}.{tag}"] = va / vb
    return out


def replica_ratios(paths: dict) -> dict:
    """Scaling with ``--replicas``: each ``PATH@rN``'s throughput over the fewest replicas' (and
    over the single process, ``PATH``, when it was measured too)."""
    out = {}
    for base in ("fast", "split-plain"):
        runs = sorted((int(p.partition("@r")[2]), p) for p in paths if p.startswith(base + "@r"))
        baselines = [b for b in (runs[0][1] if runs else None, base) if b in paths]
        for _, p in runs:
            for b in baselines:
                if b == p:
                    continue
                for tag, r in paths[p].items():
                    rb = paths[b].get(tag)
                    if tag.startswith("c") and not tag.startswith("ctx") and isinstance(rb, dict) and rb.get("output_tok_s"):
                        out[f"{p}_over_{b}.output_tok_s.{tag}"] = r["output_tok_s"] / rb["output_tok_s"]
    return out


def _scalar(v):
    if isinstance(v, dict):
        return v.get("mean")
    return v


def all_figure_lines(results: dict) -> list[str]:
    lines = []
    for path, by_tag in results["paths"].items():
        for tag, r in by_tag.items():
            if isinstance(r, dict):
                lines += figure_lines(path, r, f".{tag}", skip=NOT_FIGURES)
            else:
                lines.append(f"figure {path}.{tag} {r:.6g}")
    for name, facts in results.get("peers", {}).items():  # setup, per FHE layer and per remote call
        for block in ("setup", "per_layer"):
            lines += figure_lines(f"{name}.{block}", facts.get(block) or {})
        for kind, c in (facts.get("calls") or {}).items():
            lines += figure_lines(f"{name}.call.{kind}", c)
    for name, v in results.get("ratios", {}).items():
        lines.append(f"figure ratio.{name} {v:.6g}")
    return lines


def write_outputs(out: Path, results: dict) -> None:
    from veil.benchmarks.report import write_plots, write_report

    out.mkdir(parents=True, exist_ok=True)
    partial = tuple(name for name, f in results.get("peers", {}).items()
                    if len(f.get("fhe_layer_ids") or ()) < (f.get("server_layers") or 0))
    results["ratios"] = ratios(results["paths"], partial)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=float))
    write_report(out / "report.md", results)
    write_plots(out, results)


def _add_extras(results: dict, peers: list, extraction: dict | None, parser) -> None:
    from veil.benchmarks.peer_results import add_peer

    for path, peer in peers:
        try:
            add_peer(results, peer, path)
        except ValueError as e:
            parser.error(str(e))
    if extraction is not None:
        results["extraction"] = extraction


def render_from(source: Path, peers: list, extraction: dict | None, out: Path, parser) -> int:
    """The report of an earlier run of Veil's paths, with peers and the attack added."""
    from veil.benchmarks.peer_results import results_from

    try:
        results = results_from(source)
    except ValueError as e:
        parser.error(str(e))
    _add_extras(results, peers, extraction, parser)
    write_outputs(out, results)
    for line in all_figure_lines(results):
        print(line, flush=True)
    say(f"wrote {out}/results.json, report.md and plots (Veil's figures from {source})")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="veil bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paths", default=",".join(ALL_PATHS))
    p.add_argument("--out", type=Path, default=Path("bench_out/overhead"))
    p.add_argument("--contexts", default="16,64,128")
    p.add_argument("--concurrency", default="1,4,16,64")
    p.add_argument("--concurrency-prompt", type=int, default=64, help="prompt tokens of the concurrency runs")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--k", type=int, default=2, help="split point of split-plain and protected")
    p.add_argument("--replicas", default="single",
                   help="servers to measure, in turn: 'single' (one `veil serve` process; paths named as "
                        "such) and/or replica counts N (`veil serve --replicas N` on Ray Serve; paths named "
                        "PATH@rN), e.g. 1,2 or single,1,2")
    p.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=200.0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="the server's engine device")
    p.add_argument("--server-threads", type=int, help="torch threads of the server (default: half the cores)")
    p.add_argument("--client-threads", type=int,
                   help="torch threads of this process, the SDK client (default: the cores the server leaves)")
    p.add_argument("--quick", action="store_true",
                   help="tiny settings: context 16, 4 new tokens, concurrency 1,2, one protected layer")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--peer", action="append", default=[], metavar="[NAME=]FILE",
                   help="a peer's result (schema veil.peer/1) on the same workload: rows in every table and "
                        "plot, under the peer's own name or NAME (two runs of one peer)")
    p.add_argument("--from", dest="from_", type=Path,
                   help="Veil's rows from an earlier run (results.json or a protected_overhead JSON): no measuring")
    p.add_argument("--extraction", type=Path, help="an extraction_attack JSON to add to the report")
    args = p.parse_args(argv)
    try:
        from veil.benchmarks.peer_results import load_peer

        peers = [(Path(f), load_peer(Path(f), name or None)) for name, _, f in
                 (spec.rpartition("=") for spec in args.peer)]
        extraction = json.loads(args.extraction.read_text()) if args.extraction else None
    except (ValueError, OSError, json.JSONDecodeError) as e:
        p.error(str(e))
    if args.from_:
        return render_from(args.from_, peers, extraction, args.out, p)
    if args.quick:
        args.contexts, args.concurrency, args.max_new_tokens, args.concurrency_prompt = "16", "1,2", 4, 16
        if "--k" not in (argv if argv is not None else sys.argv):
            args.k = 29  # one protected layer of SmolLM2's 30
    args.paths = [x for x in args.paths.split(",") if x]
    unknown = set(args.paths) - set(ALL_PATHS)
    if unknown:
        p.error(f"unknown paths {sorted(unknown)}; choose from {', '.join(ALL_PATHS)}")
    args.contexts = [int(x) for x in args.contexts.split(",")]
    args.replicas = [None if x == "single" else int(x) for x in args.replicas.split(",") if x]
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    cores = os.cpu_count() or 2
    server_threads = args.server_threads or max(1, cores // 2)
    threads = {"server": server_threads, "client": args.client_threads or max(1, cores - server_threads),
               "reference": torch.get_num_threads()}
    results = {"schema": SCHEMA, "interrupted": False, "machine": machine(args.k),
               "settings": {"paths": args.paths, "contexts": args.contexts, "concurrency": args.concurrency,
                            "max_new_tokens": args.max_new_tokens, "k": args.k, "quick": args.quick,
                            "slo_ttft_ms": args.slo_ttft_ms, "slo_tpot_ms": args.slo_tpot_ms,
                            "concurrency_prompt": args.concurrency_prompt, "device": args.device,
                            "threads": threads, "replicas": ["single" if r is None else r for r in args.replicas]},
               "paths": {}}
    t0 = time.perf_counter()
    try:
        measure(args, results)
    except KeyboardInterrupt:
        results["interrupted"] = True
        say("interrupted: writing what was measured so far…")
    results["wall_s"] = time.perf_counter() - t0
    _add_extras(results, peers, extraction, p)
    write_outputs(args.out, results)
    for line in all_figure_lines(results):
        print(line, flush=True)
    say(f"wrote {args.out}/results.json, report.md and plots in {results['wall_s']:.0f} s")
    return 130 if results["interrupted"] else 0


if __name__ == "__main__":
    sys.exit(main())
