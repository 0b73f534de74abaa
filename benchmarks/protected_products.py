"""The four products of a protected layer for several baby-step counts, several backends in
one run: ``python -m veil.benchmarks.protected_products --n1 16,8 --backends seal,native
[--keys full,compact,minimal] [--positions 8] [--pack 1,2,4] [--device cpu|cuda] [--repeat N]
[--out FILE]``.

Why: the baby-step count ``n1`` of a product sets both its server time (``n1 - 1`` hoistable
rotations of the input, ``n2 - 1`` giant-step rotations one level lower) and the client's
evaluation keys (a Galois key for every baby step, at the level of the product's input). A
key for level l holds (l+1)(l+2) of the 8 x 9 residue runs of a top-level key, so the baby
steps of W_qkv (level 7) are the heaviest keys of the protected path. This benchmark times
each product with the real shapes, slot layouts, input spans and levels of
``veil.protected.weights`` for the model's dimensions (random weights: the time depends on the
shapes only) and prints,
per backend, matrix and ``n1``: the median seconds of one product, its rotations, and its
relative error against numpy. One ``figure products.<backend>.<matrix>.n1_<n1>.<metric>``
line each, and JSON to ``--out``.

``--positions 8`` (native, or any backend that batches) also times each product for a prefill
span of that many positions, one after another and as the rows of one batch under the session's
keys (``Circuit.matvecs``, which batches where ``HEBackend.batch_pays``): figures
``products.<backend>.<matrix>.n1_<n1>.positions_<P>.{loop,batch}_s_per_position`` and
``.batch_speedup``, the batched outputs checked bit for bit against the one-by-one ones.

``--pack 2`` (powers of two) also times each product with that many positions packed in one
input ciphertext, each in its own frame of S/pack slots (``linear.encode_matrices(pack=)``:
the plan made for the frame, its plaintexts repeated per frame): figures
``products.<backend>.<matrix>.n1_<n1>.pack_<P>.*``, with ``s_per_position`` the product's time
over P and ``rel_err`` over every position. A product taller or wider than a frame is left out
(W_gate|up and W_down need more than the 2048 slots of a frame at P = 4).

``--keys compact`` times the products under the client's compact key set
(``rotation_key_levels(key_set="compact")``): the baby steps chain from step 1
(``linear.baby_steps``), so the server holds one baby-step key instead of ``n1 - 1``;
``--keys minimal`` also makes each product's folds from its smallest (``linear.rotate``). Their
figures are named ``products.<backend>.<matrix>.n1_<n1>.<set>_keys.<metric>``; ``rotations``
counts the key switches of one product as run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from veil.crypto.backend import make_backend
from veil.crypto.linear import (
    MatvecPlan,
    encode_matrix,
    matvec,
    pack_inputs,
    plan_packed,
    replicate_input,
    unpack_outputs,
)
from veil.crypto.params import PROTECTED_PARAMS
from veil.engine.loader import load_checkpoint
from veil.protected.key_levels import KEY_SETS
from veil.protected.layouts import LayoutDims, dims_of, hidden_layout
from veil.protected.protocol import LEVELS
from veil.protected.weights import MATRIX_LAYOUTS, input_spans, matrix_shapes


def _plans(dims: LayoutDims, n1s: list[int], packs: list[int] = (1,)) -> dict[tuple[str, int, int], MatvecPlan]:
    """Each product's plan for every ``n1`` and positions per ciphertext (``pack``: frames of
    S/pack slots, ``encode_matrices``); a product too tall or wide for a frame is left out."""
    out = {}
    for name, (rows, cols) in matrix_shapes(dims).items():
        for n1 in n1s:
            for pack in packs:
                try:
                    out[name, n1, pack] = plan_packed(rows, cols, dims.slots, MATRIX_LAYOUTS[name], n1,
                                                      *_input(dims, name, pack))
                except ValueError:
                    print(f"# {name} ({rows}x{cols}) does not fit frames of {dims.slots // pack} slots", flush=True)
    return out


def _input(dims: LayoutDims, name: str, pack: int) -> tuple[int, int, int]:
    """(span, pack, frames): one position per ciphertext reads the protocol's own layout (the
    hidden layout's frames for W_qkv and W_gate|up); P positions read one period per frame."""
    span, frames = input_spans(dims)[name]
    return (span, 1, frames) if pack == 1 else (span, pack, 1)


def _key_levels(plans, key_set: str) -> dict[int, int]:
    """Every step the plans rotate by under ``key_set``, at the highest level it runs at."""
    need: dict[int, int] = {}
    for (name, _, _), plan in plans.items():
        for st, level in plan.key_levels(LEVELS.matrices[name], chained=key_set != "full",
                                         composed_folds=key_set == "minimal").items():
            need[st] = max(need.get(st, 0), level)
    return need


def _span(server, client, m, name: str, level: int, cols: int, positions: int, repeat: int, rng) -> dict:
    """One product for ``positions`` inputs: one after another, then as the rows of one batch."""
    cts = [server.mod_switch_to(client.encrypt(replicate_input(rng.standard_normal(cols), PROTECTED_PARAMS.slot_count)),
                                level) for _ in range(positions)]
    batch = type(server).batched([server] * positions)
    stacked = batch.stack(cts)
    loop, rows = [], []
    for _ in range(repeat + 1):  # the first of each: warm-up
        t = time.perf_counter()
        ys = [matvec(server, m, ct) for ct in cts]
        loop.append(time.perf_counter() - t)
        t = time.perf_counter()
        yb = batch.unstack(matvec(batch, m, stacked))
        rows.append(time.perf_counter() - t)
    same = all(server.serialize(a) == server.serialize(b) for a, b in zip(ys, yb, strict=True))
    if not same:
        raise AssertionError(f"{name}: the batched product differs from the one-by-one products")
    lp, bp = statistics.median(loop[1:]) / positions, statistics.median(rows[1:]) / positions
    return {"loop_s_per_position": lp, "batch_s_per_position": bp, "batch_speedup": lp / bp}


def run(dims: LayoutDims, backend: str, device: str, n1s: list[int], repeat: int, fig, keys: str = "full",
        positions: list[int] = (), packs: list[int] = (1,)) -> dict:
    opts = {"device": device} if backend == "native" else {}
    client = make_backend(PROTECTED_PARAMS, backend, **opts)
    plans = _plans(dims, n1s, packs)
    client.generate_keys(_key_levels(plans, keys))
    server = make_backend(PROTECTED_PARAMS, backend, **opts)
    server.import_public_material(client.export_public_material())
    switches = [0]  # key switches of the last product, as run
    rotate, rotate_many = server.rotate, server.rotate_many

    def counted(ct, step):
        switches[0] += 1
        return rotate(ct, step)

    def counted_many(ct, steps):  # one count per step: the base class loops over rotate
        steps = list(steps)
        server.rotate = rotate
        try:
            return rotate_many(ct, steps)
        finally:
            switches[0] += len(steps)
            server.rotate = counted

    server.rotate, server.rotate_many = counted, counted_many
    rng = np.random.default_rng(0)
    out = {}
    for (name, n1, pack), plan in plans.items():
        rows, cols = matrix_shapes(dims)[name]
        level = LEVELS.matrices[name]
        w = rng.standard_normal((rows, cols)) / np.sqrt(cols)
        xs = rng.standard_normal((pack, cols))
        span, _, frames = _input(dims, name, pack)
        slots = PROTECTED_PARAMS.slot_count
        vec = hidden_layout(xs[0], slots) if frames > 1 else pack_inputs(xs, slots, pack)
        ct = server.mod_switch_to(client.encrypt(vec), level)
        m = encode_matrix(server, w, level, n1, MATRIX_LAYOUTS[name], max_input_span=span, pack=pack, frames=frames)
        switches[0] = 0
        matvec(server, m, ct)  # warm-up
        rotations = switches[0]
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            y = matvec(server, m, ct)
            times.append(time.perf_counter() - t)
        ref = xs @ w.T
        err = float(np.abs(unpack_outputs(client.decrypt(y), rows, pack) - ref).max() / np.abs(ref).max())
        tag = (f"{backend}.{name}.n1_{n1}" + ("" if keys == "full" else f".{keys}_keys")
               + ("" if pack == 1 else f".pack_{pack}"))
        res = {"level": level, "n1": plan.n1, "n2": plan.n2, "rotations": rotations,
               "plaintexts": len(m.plaintexts), "matvec_s": statistics.median(times),
               "s_per_position": statistics.median(times) / pack, "rel_err": err}
        for p in positions if server.supports_batch and pack == 1 else ():
            if p > 1:
                res[f"positions_{p}"] = _span(server, client, m, name, level, cols, p, repeat, rng)
        for k, v in res.items():
            for kk, vv in (v.items() if isinstance(v, dict) else [(None, v)]):
                fig(f"{tag}.{k}" + (f".{kk}" if kk else ""), vv)
        out[tag] = res
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n1", default="16,8", help="comma-separated baby-step counts")
    ap.add_argument("--backends", default="seal,native")
    ap.add_argument("--keys", default="full", help=f"comma-separated key sets: {', '.join(KEY_SETS)}")
    ap.add_argument("--device", default="cpu", help="where the native backend computes")
    ap.add_argument("--positions", default="", help="comma-separated span lengths: each product also "
                    "for that many positions, one by one and batched (backends that batch)")
    ap.add_argument("--pack", default="1", help="comma-separated positions per ciphertext (powers of two): "
                    "each product also for that many positions packed in one input")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--model", help="a .gguf file or a Hugging Face directory (default: the shipped SmolLM2)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    fig = lambda k, v: print(f"figure products.{k} {v:.6g}", flush=True)  # noqa: E731
    n1s = [int(x) for x in args.n1.split(",")]
    dims = dims_of(load_checkpoint(args.model).config, PROTECTED_PARAMS.slot_count)
    results = {}
    for backend in args.backends.split(","):
        for keys in args.keys.split(","):
            if keys not in KEY_SETS:
                ap.error(f"unknown key set {keys!r}")
            results.update(run(dims, backend, args.device, n1s, args.repeat, fig, keys,
                               [int(x) for x in args.positions.split(",") if x],
                               [int(x) for x in args.pack.split(",")]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
