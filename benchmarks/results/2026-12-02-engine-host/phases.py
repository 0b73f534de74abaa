"""The engine loop's host work per step, by phase, on issue 22's 256-request workload shape.

    python phases.py [--model tiny|shipped] [--requests 256] [--lens 100,1024]

`tiny` is a random-weight Llama of 1 layer, d = 64, vocabulary 512 (token ids drawn below 500),
so the forward pass costs little and the loop's own Python (schedule, prepare, advance,
postprocess, the step metadata) is what is measured; on a GPU that Python is time the device
idles unless the loop overlaps it. `shipped` is SmolLM2 as shipped. Each phase is timed by
wrapping the method (works on any commit); the engine is driven directly
(veil.benchmarks.engine_direct, greedy, EOS ignored, every request at t = 0).
"""
import argparse
import collections
import time

import torch

from veil.benchmarks.engine_direct import run_engine
from veil.benchmarks.workload import random_workload
from veil.engine import model_runner as M
from veil.engine import scheduler as S
from veil.engine.config import ModelConfig
from veil.engine.loader import Checkpoint


def tiny_checkpoint(d=64, f=128, v=512, heads=4, kv_heads=2, layers=1) -> Checkpoint:
    hd = d // heads
    cfg = ModelConfig(vocab_size=v, hidden_size=d, intermediate_size=f, num_layers=layers, num_heads=heads,
                      num_kv_heads=kv_heads, head_dim=hd, rms_norm_eps=1e-5, rope_theta=10000.0,
                      max_position_embeddings=4096, tie_word_embeddings=True, name="tiny-random")
    g = torch.Generator().manual_seed(0)  # weights of a timing model, not key material

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.02

    t = {"model.embed_tokens.weight": r(v, d), "model.norm.weight": torch.ones(d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": r(d, d), p + "self_attn.k_proj.weight": r(kv_heads * hd, d),
                  p + "self_attn.v_proj.weight": r(kv_heads * hd, d), p + "self_attn.o_proj.weight": r(d, d),
                  p + "mlp.gate_proj.weight": r(f, d), p + "mlp.up_proj.weight": r(f, d),
                  p + "mlp.down_proj.weight": r(d, f), p + "input_layernorm.weight": torch.ones(d),
                  p + "post_attention_layernorm.weight": torch.ones(d)})
    return Checkpoint(cfg, t, None, "tiny-random", 0.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny", choices=["tiny", "shipped"])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--lens", default="100,1024")
    args = ap.parse_args()
    T, N = collections.defaultdict(float), collections.Counter()

    def wrap(cls, name):
        f = getattr(cls, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                T[name] += time.perf_counter() - t0
                N[name] += 1
        setattr(cls, name, timed)

    for cls, name in [(S.Scheduler, "schedule"), (M.ModelRunner, "prepare"), (S.Scheduler, "advance"),
                      (M.ModelRunner, "_meta"), (S.Scheduler, "postprocess"), (M.ModelRunner, "launch"),
                      (M.ModelRunner, "finish")]:
        wrap(cls, name)
    lo, hi = (int(x) for x in args.lens.split(","))
    torch.set_num_threads(1)
    ckpt = tiny_checkpoint() if args.model == "tiny" else None
    vocab = (1, 500) if args.model == "tiny" else (100, 49000)
    wl = random_workload(args.requests, (lo, hi), (lo, hi), vocab=vocab)
    s = run_engine(wl, max_seqs=256, kv_cache_gb=2.0, max_tokens_per_step=8192, threads=2, ckpt=ckpt)
    print(f"figure host.output_tok_s {s['output_tok_s']:.1f}")
    print(f"figure host.steps {s['steps']}")
    print(f"figure host.mean_seqs_per_step {s['mean_seqs_per_step']:.1f}")
    print(f"figure host.step_time_share {s['step_time_share']:.3f}")
    host = 0.0
    for name in ("schedule", "prepare", "advance", "_meta", "postprocess", "launch", "finish"):
        ms = 1e3 * T[name] / max(N[name], 1)
        print(f"figure host.{name.strip('_')}_ms {ms:.3f}")
        host += ms if name not in ("launch", "finish") else 0.0
    print(f"figure host.loop_host_ms {host:.3f}  # schedule + prepare + advance + meta + postprocess")


if __name__ == "__main__":
    main()
