"""The engine driven directly, in this process: no HTTP, no detokenisation, no client.

Every request of the workload is submitted at t=0 to one `Engine` (greedy, EOS ignored, exact
output lengths), at most `max_seqs` sequences per step: the same offline set-up as the vLLM
peer's `LLM.generate` with `max_num_seqs`. The time measured runs from the first submission to
the last request's end; engine construction (weights to the device, CUDA-graph capture) and an
untimed warm-up request are outside it. Besides the serving metrics it reports steps/s and the
mean number of sequences per step (how full the batches were).
"""

from __future__ import annotations

import threading
import time

import torch

from veil.benchmarks.stats import RequestRecord, summarize
from veil.benchmarks.workload import Workload


def run_engine(workload: Workload, device: str = "cpu", dtype: str = "float32", max_seqs: int = 16,
               kv_cache_gb: float = 4.0, max_tokens_per_step: int = 512, threads: int | None = None,
               cuda_graphs: bool = True, ckpt=None, overlap: bool | None = None) -> dict:
    from veil.engine.api import EngineConfig
    from veil.engine.engine import Engine
    from veil.engine.loader import build_model, load_checkpoint
    from veil.engine.sampling import SamplingParams

    # The engine loop owns the torch threads (EngineConfig.threads): this thread stays at 1, and a
    # caller that passes `ckpt` should have been at 1 since before loading it.
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(1)
    ckpt = ckpt or load_checkpoint()
    model = build_model(ckpt, dtype=getattr(torch, dtype))
    steps: list = []
    cfg = EngineConfig(kv_cache_bytes=int(kv_cache_gb * (1 << 30)), max_tokens_per_step=max_tokens_per_step,
                       max_seqs_per_step=max_seqs, device=device, cuda_graphs=cuda_graphs, threads=threads,
                       overlap=overlap)
    engine = Engine(model, 0, cfg, on_step=steps.append).start()
    done = threading.Semaphore(0)
    try:
        greedy = SamplingParams()
        engine.add_request("warm-up", workload.requests[0].prompt_ids[:16], 4, greedy,
                           on_finish=lambda r: done.release())
        done.acquire()
        steps.clear()
        records = [RequestRecord(arrival=0.0, prompt_tokens=len(r.prompt_ids)) for r in workload.requests]

        def on_token(rec: RequestRecord):
            def f(token: int) -> None:
                now = time.perf_counter()
                if rec.first_token is None:
                    rec.first_token = now
                else:
                    rec.itl.append(now - rec.end)
                rec.end = now
                rec.output_tokens += 1
            return f

        t0 = time.perf_counter()
        for rec, req in zip(records, workload.requests, strict=True):
            rec.arrival = t0
            engine.add_request("bench", req.prompt_ids, req.max_new_tokens, greedy, on_token=on_token(rec),
                               on_finish=lambda r: done.release())
        for _ in workload.requests:
            done.acquire()
        duration = time.perf_counter() - t0
    finally:
        engine.stop()
    for rec, req in zip(records, workload.requests, strict=True):
        if rec.output_tokens != req.max_new_tokens:
            rec.error = f"expected {req.max_new_tokens} tokens, got {rec.output_tokens}"
    s = summarize(records, duration)
    s.update(engine_stats(steps, duration))
    s.update({"device": device, "dtype": dtype, "max_seqs": max_seqs, "threads": cfg.threads,
              "cuda_graphs": bool(cuda_graphs and device.startswith("cuda")), "overlap": engine.overlap})
    return s


def engine_stats(steps: list, duration: float) -> dict:
    """steps/s, mean sequences and tokens per step, the share of the run spent in steps, and the
    loop's host time per step."""
    n = max(len(steps), 1)
    return {"steps": len(steps), "steps_s": len(steps) / duration,
            "mean_seqs_per_step": sum(s.num_seqs for s in steps) / n,
            "mean_tokens_per_step": sum(s.num_tokens for s in steps) / n,
            "decode_only_steps": sum(s.num_decode == s.num_seqs for s in steps),
            "step_time_share": sum(s.seconds for s in steps) / duration,
            # the loop's own host work per step (schedule, prepare, postprocess with the callbacks):
            # on a GPU, time the device idles unless the loop overlaps it (EngineConfig.overlap)
            "host_ms_per_step": 1e3 * sum(s.host_seconds for s in steps) / n}
