"""Per-layer timing of the protected executor: ``python -m veil.engine.protected_bench``.

For each context length (default 16 and 64) it times one decode step of one protected layer
at position ``ctx - 1`` with ``ctx - 1`` positions already in the encrypted KV cache, on the
real SmolLM2 weights and the real parameter set. The cache of the earlier positions is seeded
directly (the client encrypts the true k̂_j, v̂_j in the cache layout; bench-only shortcut so
that context 64 does not need 63 timed steps); the timed step is the real protocol.

Prints the server time split by operation kind (matvec, ctct, rotations, refresh, flooding,
serialization, other), the client time, bytes up and down for the layer, the layer's output
error against the plaintext block, and a whole-model extrapolation (``--layers`` protected
layers, default 28 for k=2), one ``figure protected.<metric> <value>`` line per number.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import torch

from veil.crypto.layouts import BLOCK, PROTECTED_PARAMS
from veil.crypto.seal_backend import SealBackend
from veil.engine.protected import (
    ProtectedExecutor,
    layer_weights_from_tensors,
    required_rotation_steps,
    rope_cos_sin,
)
from veil.engine.protected_client import ProtectedClientState

PROMPT = (
    "Veil runs the protected layers of a language model on encrypted activations. The server "
    "never sees the prompt, the hidden states or the output; the client never sees the weights. "
) * 6


def fig(name: str, value: float) -> None:
    print(f"figure protected.{name} {value:.6g}", flush=True)


def _plain_inputs(model, tok, layer: int, ctx: int):
    ids = tok(PROMPT, return_tensors="pt")["input_ids"][0][:ctx]
    assert len(ids) == ctx
    with torch.no_grad():
        h = model.run_layers(model.embed(ids), 0, layer)
        out = model.run_layers(h, layer, layer + 1)
    return h.double().numpy(), out.double().numpy()


def _seed_cache(ex, client, session, weights, cfg, layer, h_in, n):
    """Bench-only: put the true k̂_j, v̂_j of positions < n into the encrypted cache."""
    dims, lv = ex.dims, ex.levels
    q = dims.qdim
    chunks_k, chunks_v = [], []
    vec_k = vec_v = None
    for j in range(n):
        c, b = divmod(j, dims.per_chunk)
        if b == 0:
            vec_k, vec_v = np.zeros(dims.slots), np.zeros(dims.slots)
            chunks_k.append(vec_k)
            chunks_v.append(vec_v)
        y = weights.w_qkv @ h_in[j]
        cos, sin = rope_cos_sin(cfg, j)
        k = y[q : 2 * q].reshape(dims.heads, dims.head_dim)
        half = dims.head_dim // 2
        k = k * cos + np.concatenate([-k[:, half:], k[:, :half]], 1) * sin
        vec_k[BLOCK * b : BLOCK * b + q] = k.ravel()
        vec_v[BLOCK * b : BLOCK * b + q] = y[2 * q :]
    kv = session.kv[layer]
    kv.keys = [ex.be._be.deserialize(client.be.encrypt_to_bytes(v, level=lv.kv), level=lv.kv) for v in chunks_k]
    kv.values = [ex.be._be.deserialize(client.be.encrypt_to_bytes(v, level=lv.kv), level=lv.kv) for v in chunks_v]
    session.kv_bytes = 2 * len(chunks_k) * 2 * (lv.kv + 1) * dims.slots * 2 * 8
    session.length = session.position = n
    client.position = n
    client.r[layer] = [float(np.sqrt((h_in[j] ** 2).mean() + cfg.rms_norm_eps)) for j in range(n)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layer", type=int, default=10)
    ap.add_argument("--contexts", default="16,64")
    ap.add_argument("--layers", type=int, default=28, help="protected layers for the extrapolation")
    args = ap.parse_args(argv)

    from veil.engine.loader import build_model, load_checkpoint

    ckpt = load_checkpoint()
    model, cfg = build_model(ckpt), ckpt.config
    steps = required_rotation_steps(cfg)
    t = time.perf_counter()
    client_be = SealBackend(PROTECTED_PARAMS)
    client_be.generate_keys(steps)
    material = client_be.export_public_material()
    fig("keygen_s", time.perf_counter() - t)
    fig("galois_keys", len(steps))
    fig("setup_bytes", material.nbytes)
    server_be = SealBackend(PROTECTED_PARAMS)
    server_be.import_public_material(material)
    t = time.perf_counter()
    weights = layer_weights_from_tensors(ckpt.tensors, cfg, args.layer)
    ex = ProtectedExecutor(server_be, cfg, [weights])
    fig("encode_layer_s", time.perf_counter() - t)
    fig("encoded_bytes_per_layer", ex.encoded_bytes)

    for ctx in (int(c) for c in args.contexts.split(",")):
        h_in, ref = _plain_inputs(model, ckpt.tokenizer, args.layer, ctx)
        session = ex.new_session()
        client = ProtectedClientState(client_be, cfg, args.layer, args.layer + 1, session.id)
        _seed_cache(ex, client, session, weights, cfg, args.layer, h_in, ctx - 1)
        ex.be.reset()
        t_client = 0.0
        t0 = time.perf_counter()
        tc = time.perf_counter()
        msg = client.token_message(h_in[ctx - 1])
        t_client += time.perf_counter() - tc
        first_up = msg.nbytes
        round_trips = 0
        while True:
            reply = ex.handle(msg)
            round_trips += 1
            tc = time.perf_counter()
            nxt = client.handle(reply)
            t_client += time.perf_counter() - tc
            if isinstance(nxt, np.ndarray):
                break
            msg = nxt
        wall = time.perf_counter() - t0
        server = sum(ex.be.times.values())
        err = np.linalg.norm(nxt - ref[ctx - 1]) / np.linalg.norm(ref[ctx - 1])
        final_down = reply.nbytes
        up_layer = client.bytes_up - first_up  # weights + mlp_in of the layer
        down_layer = client.bytes_down - final_down  # scores + mlp of the layer
        tag = f"ctx{ctx}"
        fig(f"layer_server_s.{tag}", server)
        for kind in ("matvec", "ctct", "rotations", "refresh", "flooding", "serialization", "other"):
            fig(f"layer_server_s.{kind}.{tag}", ex.be.times.get(kind, 0.0))
        fig(f"layer_client_s.{tag}", t_client)
        fig(f"layer_wall_s.{tag}", wall)
        fig(f"layer_bytes_up.{tag}", up_layer)
        fig(f"layer_bytes_down.{tag}", down_layer)
        fig(f"token_bytes_in_out.{tag}", first_up + final_down)
        fig(f"layer_rel_err.{tag}", err)
        fig(f"kv_bytes_per_layer.{tag}", session.kv_bytes)
        fig(f"rotations_per_layer.{tag}", ex.be.counts.get("rotate", 0))
        n = args.layers
        fig(f"tpot_s.extrapolated.{tag}", n * (server + t_client))
        fig(f"bytes_per_token.extrapolated.{tag}", n * (up_layer + down_layer) + first_up + final_down)
        fig(f"round_trips_per_token.{tag}", 2 * n + 1)
        for shape, dt in ex.be.matvec_by_shape.items():
            print(f"# ctx {ctx}: matvec {shape}: {dt:.3f} s", flush=True)
        print(f"# ctx {ctx}: counts {dict(ex.be.counts)}", flush=True)
    fig("peak_rss_bytes", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


if __name__ == "__main__":
    main()
