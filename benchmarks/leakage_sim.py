"""Leakage of W_gate through the first protected layer, on a PLAINTEXT SIMULATION of the client's
transcript (not the HE run; `benchmarks/extraction_attack.py` on the real protected path is
still to be written):

    python -m veil.benchmarks.leakage_sim [--k 2]

The first protected layer ``k`` takes ``h_k``, which the client computed itself. The client
decrypts ``û_g = W_gate γ2 h'_k``, where ``h'_k = h_k + o_k`` and ``o_k`` is the attention output
it never sees. This script computes exactly those values with the plaintext model over
``2d`` tokens of real text, adds Gaussian noise of the flooding size (2^-11.5 per slot), and
fits ``W_gate γ2`` by least squares and by ridge regression of ``û_g`` on ``h_k``. For
comparison it runs the linear-only attack: Concrete ML's hybrid mode shows the client each
linear layer's input ``h'`` and output, and the attacker regresses one on the other. It prints
each attack's relative error ‖Ŵ − W‖/‖W‖.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch


def main(argv: list[str] | None = None) -> int:
    from veil.engine.loader import build_model, load_checkpoint

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k", type=int, default=2, help="the first protected layer")
    args = p.parse_args(argv)
    ckpt = load_checkpoint()
    model, cfg = build_model(ckpt), ckpt.config
    d, k = cfg.hidden_size, args.k
    n = 2 * d
    root = Path(__file__).resolve().parent.parent
    text = "\n".join(f.read_text() for f in sorted(root.glob("*/*.py")) + [root / "README.md"])
    ids = ckpt.tokenizer(text)["input_ids"]
    layer = model.layers[str(k)]
    w = (layer.mlp.gate_proj.weight * layer.post_attention_layernorm.weight[None, :]).double().numpy()
    xs, xps = [], []
    with torch.no_grad():
        for start in range(0, len(ids), 256):
            chunk = torch.tensor(ids[start:start + 256])
            h = model.run_layers(model.embed(chunk), 0, k)
            pos = torch.arange(len(chunk))
            cos, sin = model.rotary.cos_sin(pos, h.dtype)
            a, _ = layer.self_attn(layer.input_layernorm(h), cos, sin, pos, None)
            xs.append(h.double().numpy())
            xps.append((h + a).double().numpy())
            if sum(len(x) for x in xs) >= n:
                break
    x, xp = np.concatenate(xs)[:n], np.concatenate(xps)[:n]
    if len(x) < n:
        raise SystemExit(f"only {len(x)} tokens of text, need {n}")
    u = xp @ w.T
    u_seen = u + np.random.default_rng(0).normal(scale=2**-11.5, size=u.shape)

    def rel(w_hat):
        return float(np.linalg.norm(w_hat - w) / np.linalg.norm(w))

    linear_only = rel(np.linalg.lstsq(xp, u, rcond=None)[0].T)
    veil_lstsq = rel(np.linalg.lstsq(x, u_seen, rcond=None)[0].T)
    veil_ridge, lam = min((rel(np.linalg.solve(x.T @ x + lam * np.eye(d), x.T @ u_seen).T), lam)
                          for lam in (1e-4, 1e-2, 1.0, 10.0, 100.0, 1e3, 1e4))
    print(f"# layer {k}, {n} tokens, |o|/|h| = {np.linalg.norm(xp - x) / np.linalg.norm(x):.3f}", file=sys.stderr)
    print(f"figure leakage_sim.linear_only.rel_err {linear_only:.6g}")
    print(f"figure leakage_sim.veil_lstsq.rel_err {veil_lstsq:.6g}")
    print(f"figure leakage_sim.veil_ridge.rel_err {veil_ridge:.6g}")
    print(f"# best ridge lambda {lam}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
