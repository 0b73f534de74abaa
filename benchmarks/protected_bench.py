"""Per-layer timing of the protected executor: ``python -m veil.benchmarks.protected_bench``.

For each context length (default 16 and 64) it times one decode step through two protected
layers ``[layer, layer + 2)`` at position ``ctx - 1`` with ``ctx - 1`` positions already in
the encrypted KV cache, on the real SmolLM2 weights and the real parameter set. The cache of
the earlier positions is seeded directly (the client encrypts the true k̂_j, v̂_j in the cache
layout; bench-only shortcut so that context 64 does not need 63 timed steps); the timed step
is the real protocol.

Two layers because a middle layer's cycle (WEIGHTS -> MLP, MLP_IN -> REFRESH, REFRESHED ->
next layer's SCORES) differs from the last layer's (MLP_IN -> FINAL). The per-layer figures are
the first layer's cycle; the whole-model extrapolation (``--layers`` protected layers, default
28 for k=2) is the measured two-layer step plus ``layers - 2`` cycles without the first layer's
FFN shuffle (the executor shuffles its first protected layer only). Each context's step runs
once untimed first (``--warmup``), as a server's steps run warm.

Prints the server time split by operation kind (matvec, ctct, rotations, refresh, flooding,
serialization, other; on CUDA from one more step that waits for the device at every op kind's
boundary, since the timed step runs as a server does, without those waits, and a kind's wall
time there carries the queued work of earlier ones), the client time, bytes up and down for the layer, the output error
against the plaintext blocks, one ``figure protected.<backend>.<metric> <value>`` line per
number. ``--profile`` steps the first context once more under the torch profiler, without a
synchronization per op kind, and reports the server's host seconds against the device seconds
of the kernels it launched, the launches and the torch ops (``host_device``, ``profile.*``). ``--he-backend seal,native`` measures both backends in one run, on the same inputs (the
client and the server of a run use the same backend).
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from veil.crypto.backend import backend_names, make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.protected.client import ProtectedClientState
from veil.protected.key_levels import relin_key_level, rotation_key_levels
from veil.protected.layouts import dims_of
from veil.protected.protocol import MsgKind
from veil.protected.server import ProtectedExecutor
from veil.protected.weights import layer_weights_from_tensors, rope_cos_sin
from veil.server.config import ServerConfig

PROMPT = (
    "Veil runs the protected layers of a language model on encrypted activations. The server "
    "never sees the prompt, the hidden states or the output; the client never sees the weights. "
) * 6


FIGURES: dict[str, dict[str, float]] = {}
PROFILES: dict[str, dict] = {}  # --profile: context tag -> host_device.summarize's figures


def fig(backend: str, name: str, value: float) -> None:
    FIGURES.setdefault(backend, {})[name] = float(value)
    print(f"figure protected.{backend}.{name} {value:.6g}", flush=True)


def _plain_inputs(model, tok, layer: int, ctx: int):
    """Inputs of layers ``layer`` and ``layer + 1`` and the output of ``layer + 1``."""
    ids = tok(PROMPT, return_tensors="pt")["input_ids"][0][:ctx]
    assert len(ids) == ctx
    with torch.no_grad():
        h0 = model.run_layers(model.embed(ids), 0, layer)
        h1 = model.run_layers(h0, layer, layer + 1)
        out = model.run_layers(h1, layer + 1, layer + 2)
    return h0.double().numpy(), h1.double().numpy(), out.double().numpy()


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
        kvd = dims.kv_dim
        k = y[q : q + kvd].reshape(dims.kv_heads, dims.head_dim)
        half = dims.head_dim // 2
        k = k * cos + np.concatenate([-k[:, half:], k[:, :half]], 1) * sin
        # head slot g holds KV head g % kv_heads (``veil.protected.layouts``)
        vec_k[dims.block_base(b) : dims.block_base(b) + q] = np.tile(k.ravel(), dims.group)
        vec_v[dims.value_base(b) : dims.value_base(b) + q] = np.tile(y[q + kvd :], dims.group)
    kv = session.kv[layer]
    kv.keys = [ex.be.inner.deserialize(client.be.encrypt_to_bytes(v, lv.keys), level=lv.keys) for v in chunks_k]
    kv.values = [ex.be.inner.deserialize(client.be.encrypt_to_bytes(v, lv.kv), level=lv.kv) for v in chunks_v]
    session.kv_bytes += sum(ex.be.inner.nbytes(ct) for ct in kv.keys + kv.values)
    session.state = replace(session.state, length=n, position=n)
    client.position = n
    client.r[layer] = [float(np.sqrt((h_in[j] ** 2).mean() + cfg.rms_norm_eps)) for j in range(n)]


def _timed_step(ex, client_be, cfg, weights, layers, h0, h1, ctx: int, handle=None, synchronize: bool = False):
    """One decode step at position ``ctx - 1`` through both layers in a fresh session: the
    session, one record per round trip (upload kind, layer, server s, client s, bytes up, bytes
    down), the first layer's cycle's seconds and counts by op kind, the wall time, the output.
    ``handle`` stands in for ``ex.handle`` (the profiled step marks each message);
    ``synchronize``: on CUDA, wait for the device at every timed boundary (protected/timing.py),
    so that each op kind's seconds are its own, and the step is slower than a server runs it."""
    handle = handle or ex.handle
    ex.be.synchronize = synchronize
    session = ex.new_session()
    client = ProtectedClientState(client_be, cfg, layers[0], layers[1] + 1, session.id)
    _seed_cache(ex, client, session, weights[0], cfg, layers[0], h0, ctx - 1)
    _seed_cache(ex, client, session, weights[1], cfg, layers[1], h1, ctx - 1)
    ex.be.reset()
    t0 = time.perf_counter()
    msg = client.token_message(h0[ctx - 1])
    trips, per_op, counts, by_shape = [], {}, {}, {}
    while True:
        if (msg.kind, msg.layer) == (MsgKind.WEIGHTS, layers[0]):
            ex.be.reset()  # the first layer's cycle starts here
        ts = time.perf_counter()
        reply = handle(msg)
        ts = time.perf_counter() - ts
        if (msg.kind, msg.layer) == (MsgKind.REFRESHED, layers[0]):
            per_op, counts = dict(ex.be.times), dict(ex.be.counts)
            by_shape = dict(ex.be.matvec_by_shape)
        tc = time.perf_counter()
        nxt = client.handle(reply)
        tc = time.perf_counter() - tc
        trips.append((msg.kind, msg.layer, ts, tc, msg.nbytes, reply.nbytes))
        if isinstance(nxt, np.ndarray):
            return session, trips, per_op, counts, by_shape, time.perf_counter() - t0, nxt
        msg = nxt


def bench_backend(name: str, args, ckpt, model, cfg, dims) -> None:
    """Keys, two encoded layers and the timed decode step of every context, on one backend."""
    opts = {"device": args.device} if name == "native" else {}
    steps = rotation_key_levels(dims)  # each key for the levels it serves
    t = time.perf_counter()
    client_be = make_backend(PROTECTED_PARAMS, name, **opts)
    client_be.generate_keys(steps, relin_key_level())
    material = client_be.export_public_material()
    fig(name, "keygen_s", time.perf_counter() - t)
    fig(name, "galois_keys", len(steps))
    fig(name, "setup_bytes", material.nbytes)
    server_be = make_backend(PROTECTED_PARAMS, name, **opts)
    server_be.import_public_material(material)
    t = time.perf_counter()
    layers = (args.layer, args.layer + 1)
    weights = [layer_weights_from_tensors(ckpt.tensors, cfg, i, dims) for i in layers]
    ex = ProtectedExecutor(server_be, cfg, weights, ServerConfig().protected_limits())
    fig(name, "encode_layer_s", (time.perf_counter() - t) / 2)
    fig(name, "encoded_bytes_per_layer", ex.encoded_bytes / 2)

    for ctx in (int(c) for c in args.contexts.split(",")):
        h0, h1, ref = _plain_inputs(model, ckpt.tokenizer, args.layer, ctx)
        graphs = getattr(server_be, "_graphs", None)  # VEIL_NATIVE_CUDA_GRAPHS=1 on CUDA
        # keep first use out of the figures (Triton compiles a kernel at its first shape; on the
        # CPU the heap grows); with CUDA graphs a second step captures them (a name's first call
        # runs eagerly), so that the timed step replays them
        for _ in range((2 if graphs is not None else 1) if args.warmup else 0):
            ex.drop_session(_timed_step(ex, client_be, cfg, weights, layers, h0, h1, ctx)[0].id)
        before = (graphs.captures, graphs.replays) if graphs is not None else None
        session, trips, per_op, counts, by_shape, wall, nxt = _timed_step(ex, client_be, cfg, weights, layers,
                                                                          h0, h1, ctx)
        after = (graphs.captures, graphs.replays) if graphs is not None else None
        synced_trips = None
        if args.split_round:  # the split by op kind from a step that waits at every timed boundary
            synced_session, synced_trips, per_op, counts, by_shape, _, _ = _timed_step(
                ex, client_be, cfg, weights, layers, h0, h1, ctx, synchronize=True)
            ex.drop_session(synced_session.id)
        err = np.linalg.norm(nxt - ref[ctx - 1]) / np.linalg.norm(ref[ctx - 1])
        cycle = [r for r in trips if r[1] == layers[0] and r[0] != MsgKind.TOKEN]
        assert [r[0] for r in cycle] == [MsgKind.WEIGHTS, MsgKind.MLP_IN, MsgKind.REFRESHED]
        server = sum(r[2] for r in cycle)
        t_client = sum(r[3] for r in cycle)
        up_layer, down_layer = sum(r[4] for r in cycle), sum(r[5] for r in cycle)
        tag = f"ctx{ctx}"
        fig(name, f"layer_server_s.{tag}", server)
        if synced_trips is not None:  # what waiting at each op kind's boundaries costs the same step
            fig(name, f"layer_server_s.synced.{tag}",
                sum(r[2] for r in synced_trips if r[1] == layers[0] and r[0] != MsgKind.TOKEN))
        for kind in ("matvec", "ctct", "rotations", "refresh", "flooding", "shuffle", "serialization", "other"):
            fig(name, f"layer_server_s.{kind}.{tag}", per_op.get(kind, 0.0))
        fig(name, f"layer_client_s.{tag}", t_client)
        fig(name, f"layer_bytes_up.{tag}", up_layer)
        fig(name, f"layer_bytes_down.{tag}", down_layer)
        fig(name, f"two_layer_wall_s.{tag}", wall)
        fig(name, f"two_layer_rel_err.{tag}", err)
        fig(name, f"kv_bytes_per_layer.{tag}", session.kv_bytes / 2)
        fig(name, f"rotations_per_layer.{tag}", counts.get("rotate", 0))
        n = args.layers
        step_s = sum(r[2] + r[3] for r in trips)
        step_bytes = sum(r[4] + r[5] for r in trips)
        # the FFN shuffle is the first protected layer's alone: the middle layers do not repeat it
        # (with a split round, its seconds are the synchronized step's: an estimate for this one)
        middle = server - per_op.get("shuffle", 0.0) + t_client
        fig(name, f"tpot_s.extrapolated.{tag}", step_s + (n - 2) * middle)
        fig(name, f"bytes_per_token.extrapolated.{tag}", step_bytes + (n - 2) * (up_layer + down_layer))
        fig(name, f"round_trips_per_token.{tag}", len(trips) + (n - 2) * len(cycle))
        for shape, dt in by_shape.items():
            print(f"# {name} ctx {ctx}: matvec {shape}: {dt:.3f} s", flush=True)
        print(f"# {name} ctx {ctx}: counts {counts}", flush=True)
        if graphs is not None:
            fig(name, f"graph_replays.{tag}", after[1] - before[1])
            fig(name, f"graph_captures.{tag}", after[0] - before[0])
        if args.profile and name == "native" and ctx == int(args.contexts.split(",")[0]):
            _profiled_step(ex, client_be, cfg, weights, layers, h0, h1, ctx, args.device, tag)


def _profiled_step(ex, client_be, cfg, weights, layers, h0, h1, ctx: int, device: str, tag: str) -> None:
    """The step once more under the torch profiler, each server message a marked range, with
    no synchronization per op kind (the step as a server runs it); figures for both layers'
    messages together. The profiler's own cost per op inflates the host time somewhat."""
    from torch.profiler import profile

    from veil.benchmarks.host_device import activities, marked, summarize

    def handle(msg):
        with marked(msg.kind):
            return ex.handle(msg)

    with profile(activities=activities(device)) as prof:
        session = _timed_step(ex, client_be, cfg, weights, layers, h0, h1, ctx, handle)[0]
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    ex.drop_session(session.id)
    s = summarize(prof.events())
    for key in ("host_s", "device_s", "device_busy_share", "kernels", "torch_ops"):
        fig("native", f"profile.server_{key}.{tag}", s[key])
    fig("native", f"profile.step_device_s.{tag}", s["profile_device_s"])  # the client's kernels too
    fig("native", f"profile.step_kernels.{tag}", s["profile_kernels"])
    PROFILES[tag] = s
    for n, t in s["top_kernels_s"].items():
        print(f"# profile {tag}: kernel {n}: {t:.4f} s in {s['top_kernels_count'][n]} launches", flush=True)
    print(f"# profile {tag}: torch ops called most {s['top_ops']}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layer", type=int, default=10)
    ap.add_argument("--contexts", default="16,64")
    ap.add_argument("--layers", type=int, default=28, help="protected layers for the extrapolation")
    ap.add_argument("--he-backend", default="seal",
                    help=f"comma-separated, each measured in turn: {', '.join(backend_names())}")
    ap.add_argument("--device", default="cpu", help="where the native backend computes (SEAL always on the CPU)")
    ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                    help="run each context's step once untimed first (default): a server's steps run "
                         "warm, and a first step pays once for Triton compiling each kernel at its first "
                         "shape (CUDA) or for growing the heap (CPU, results/2026-12-07-bench-warmup); "
                         "--no-warmup times a fresh process's first step")
    ap.add_argument("--split-round", action=argparse.BooleanOptionalAction, default=None,
                    help="one more step per context, waiting for the device at every op kind's boundary, "
                         "for the server time by op kind (default: on CUDA only, where the timed step "
                         "runs unsynchronized, as a server runs it, and a kind's own seconds are not known)")
    ap.add_argument("--model", help="a .gguf file or a Hugging Face directory (default: the shipped SmolLM2)")
    ap.add_argument("--profile", action="store_true",
                    help="native: one more step at the first context under the torch profiler (host vs device)")
    ap.add_argument("--out", type=Path, default=Path("bench_out/protected_bench.json"), help="JSON of the figures")
    args = ap.parse_args(argv)
    backends = args.he_backend.split(",")
    if args.split_round is None:
        args.split_round = args.device.startswith("cuda")
    for name in backends:
        if name not in backend_names():
            ap.error(f"unknown HE backend {name!r}")

    from veil.engine.loader import build_model, load_checkpoint

    ckpt = load_checkpoint(args.model)
    model, cfg = build_model(ckpt), ckpt.config
    dims = dims_of(cfg, PROTECTED_PARAMS.slot_count)
    for name in backends:
        bench_backend(name, args, ckpt, model, cfg, dims)
    # ru_maxrss is the process's peak over every backend measured so far
    fig("process", "peak_rss_bytes", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    if args.device.startswith("cuda"):
        fig("native", "device_peak_bytes", torch.cuda.max_memory_allocated())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"he_backends": backends, "device": args.device, "model": ckpt.source,
                                    "layers": [args.layer, args.layer + 1], "figures": FIGURES,
                                    "profiles": PROFILES},
                                   indent=2))


if __name__ == "__main__":
    main()
