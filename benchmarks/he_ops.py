"""Per-operation HE timings, several backends in one run:
``python -m veil.benchmarks.he_ops --backends seal,native [--device cpu|cuda] [--repeat N] [--out FILE]``.

Operations at the top level of the parameter set (default the protected path's,
ckks-n16384-l7-v1): encode, encrypt (the seeded upload), decrypt, ct x pt (no rescale),
the sum of ``--hoist`` ct x pt products (``dot_plain``: a BSGS inner sum, no rescale),
ct x ct + relinearize (no rescale), rescale, rotate, hoisted rotate x k (``rotate_many``, total
and per rotation), the NTT of one polynomial's limbs (SEAL: ``transform_to_ntt`` of a
two-polynomial ciphertext, halved), and a download's rounded wire form (``crypto/rounding.py``:
``round_download``, the server's ``serialize`` of a flooded level-1 ciphertext, and
``unround_download``, the client's ``deserialize`` of it), and a level-0 download whole
(``download_level0``: re-randomize, flood, round) and folded into the ring of N/2
(``download_level0_folded``, ``crypto/ring_switch.py``; ``decrypt_level0_folded``, the
client's side), and a masked refresh at level 1 sent whole and folded (``refresh``,
``refresh_folded``: mask, fold, round) with the client's re-encryption of each
(``reencrypt_refresh``, ``reencrypt_refresh_folded``). Median wall-clock milliseconds of ``--repeat`` runs after one
warm-up; one ``figure he.<op>_ms.<backend>.<device> <value>`` line each, and JSON to ``--out``.
SEAL runs on the CPU whatever ``--device`` says (its figures say ``cpu``). ``--compile`` adds a
``native_compiled`` run (``torch.compile`` of the hot loops; the warm-up compiles, minutes from
a cold cache) after checking that its server operations give the eager residues bit for bit.
``--cuda-graphs`` (with ``--device cuda``) adds a ``native_graphs`` run: key switches and rescales
replayed from CUDA graphs (``crypto/native/graphs.py``), checked the same way over a name's
eager, captured and replayed calls; its medians are of replays (the warm-up runs eagerly, the
first timed call captures).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS, get_params


def _median_ms(fn, repeat: int, sync=lambda: None) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def _ntt_op(name: str, server, ct, repeat: int):
    """``(fn, share)``: ``fn`` transforms ``1/share`` polynomials' limbs at the ciphertext's level."""
    if name == "native":
        _, ntt = server._ctx.data(server.level(ct))
        coeffs = ntt.inverse(ct._obj.data[0])
        return (lambda: ntt.forward(coeffs)), 1.0
    from veil.crypto.seal import format as seal_format

    sc = server._c
    lvl = sc.levels[server.level(ct)]
    polys = np.zeros((2, len(lvl.primes), sc.n), dtype=np.uint64)
    polys[:, :, 0] = 1  # not transparent
    blob = seal_format.ciphertext_blob(polys, lvl.parms_id, 1.0, False, sc.version)
    carriers = [sc.load_ct_blob(blob) for _ in range(repeat + 1)]  # in-place: one per run
    return (lambda: sc.ev.transform_to_ntt_inplace(carriers.pop())), 0.5


def _pair(name: str, params, device: str, steps: list[int], compile: bool, graphs: bool = False):
    opts = {"device": device, "compile": compile, "cuda_graphs": graphs} if name == "native" else {}
    client = make_backend(params, name, allow_test_backends=params.test_only, **opts)
    client.generate_keys(steps)
    server = make_backend(params, name, allow_test_backends=params.test_only, **opts)
    server.import_public_material(client.export_public_material())
    return client, server


def _server_ops(server, ct, cy, pt, prod, steps, babies) -> dict:
    top = server.params.top_level
    return {
        f"dot_plain{len(babies)}": lambda: server.dot_plain(babies, [pt] * len(babies)),
        "ct_x_pt": lambda: server.multiply_plain(ct, pt, rescale=False),
        "ct_x_ct_relin": lambda: server.multiply(ct, cy, rescale=False),
        "rescale": lambda: server.rescale(prod),
        "rotate": lambda: server.rotate(ct, 1),
        f"rotate_many{len(steps)}": lambda: server.rotate_many(ct, steps),
        "encode": lambda: server.encode(np.ones(8), top, server.prime(top)),
    }


def run_backend(name: str, params, device: str, repeat: int, hoist: int, compile: bool = False,
                graphs: bool = False) -> dict[str, float]:
    steps = list(range(1, hoist + 1))
    client, server = _pair(name, params, device, steps, compile, graphs)
    sync = lambda: None  # noqa: E731
    if name == "native" and device.startswith("cuda"):
        import torch

        sync = torch.cuda.synchronize
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-1, 1, params.slot_count), rng.uniform(-1, 1, params.slot_count)
    top = params.top_level
    ct = server.deserialize(client.encrypt_to_bytes(x))
    cy = server.deserialize(client.encrypt_to_bytes(y))
    pt = server.encode(y, top, server.prime(top))
    prod = server.multiply_plain(ct, pt, rescale=False)
    babies = [ct, *server.rotate_many(ct, steps[:-1])]  # a BSGS inner sum's terms
    ops = _server_ops(server, ct, cy, pt, prod, steps, babies)
    if compile or graphs:  # the compiled server, or the graphs' replays, must give the eager residues, bit for bit
        eager = make_backend(params, name, allow_test_backends=params.test_only, device=device, compile=False,
                             cuda_graphs=False)
        eager.import_public_material(client.export_public_material())
        for op, (f, g) in {k: (ops[k], v) for k, v in _server_ops(eager, ct, cy, pt, prod, steps, babies).items()}.items():
            want = g()
            for _ in range(3 if graphs else 1):  # a graph's name: eager, captured, replayed
                got = f()
                for a, b in zip(*((got, want) if isinstance(got, list) else ([got], [want])), strict=True):
                    if not torch_equal(a._obj, b._obj):
                        raise SystemExit(f"{'graphed' if graphs else 'compiled'} {op} differs from eager")
    out = {
        "encode": _median_ms(lambda: server.encode(y, top, server.prime(top)), repeat, sync),
        "encrypt": _median_ms(lambda: client.encrypt_to_bytes(x), repeat, sync),
        "decrypt": _median_ms(lambda: client.decrypt(ct), repeat, sync),
    }
    for op in ("ct_x_pt", f"dot_plain{hoist}", "ct_x_ct_relin", "rescale", "rotate", f"rotate_many{hoist}"):
        out[op] = _median_ms(ops[op], repeat, sync)
    out[f"rotate_many{hoist}_per_rotation"] = out[f"rotate_many{hoist}"] / hoist
    fn, share = _ntt_op(name, server, ct, repeat)
    out["ntt"] = _median_ms(fn, repeat, sync) * share
    down = server.rerandomize(server.mod_switch_to(ct, 1))  # like the scores download
    floor = float(np.log2(server.scale(down))) - 18
    blob = server.serialize(down, noise_log2=floor)
    out["round_download"] = _median_ms(lambda: server.serialize(down, noise_log2=floor), repeat, sync)
    out["unround_download"] = _median_ms(lambda: client.deserialize(blob), repeat, sync)
    low = server.mod_switch_to(ct, 0)  # like the MLP download: whole, and folded (``crypto/ring_switch.py``)
    floor = float(np.log2(server.scale(low))) - 18
    out["download_level0"] = _median_ms(lambda: server.serialize(server.rerandomize(low, floor), noise_log2=floor),
                                        repeat, sync)
    out["download_level0_folded"] = _median_ms(lambda: server.serialize_folded(low, floor), repeat, sync)
    folded = server.serialize_folded(low, floor)
    out["decrypt_level0_folded"] = _median_ms(lambda: client.decrypt_folded(folded), repeat, sync)
    # like the masked refresh of h'' (level 1 on 2^27; in X², as the hidden layout makes it):
    # mask and send whole or folded, and the client's re-encryption at the top level
    h = np.tile(x[: params.slot_count // 2], 2)
    ref = server.deserialize(client.encrypt_to_bytes(h, 1, 2.0**27), level=1, scale=2.0**27)
    out["refresh"] = _median_ms(lambda: server.serialize(server.mask_for_refresh(ref)[0], noise_log2=3.0), repeat, sync)
    out["refresh_folded"] = _median_ms(
        lambda: server.serialize_folded_refresh(server.mask_for_refresh(ref, fold=True)[0], 3.0), repeat, sync)
    whole = client.deserialize(server.serialize(server.mask_for_refresh(ref)[0], noise_log2=3.0), level=1)
    folded = server.serialize_folded_refresh(server.mask_for_refresh(ref, fold=True)[0], 3.0)
    out["reencrypt_refresh"] = _median_ms(lambda: client.refresh_reencrypt_to_bytes(whole), repeat, sync)
    out["reencrypt_refresh_folded"] = _median_ms(lambda: client.refresh_reencrypt_folded_to_bytes(folded), repeat, sync)
    return out


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a.data if hasattr(a, "data") else a, b.data if hasattr(b, "data") else b)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backends", default="seal,native")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--params", default=PROTECTED_PARAMS.id)
    ap.add_argument("--allow-test-params", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hoist", type=int, default=16)
    ap.add_argument("--out", default="")
    ap.add_argument("--compile", action="store_true",
                    help="also time native with torch.compile (checked bit-identical to eager)")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="also time native with its key switches replayed from CUDA graphs (--device cuda; "
                         "checked bit-identical to eager)")
    args = ap.parse_args(argv)

    params = get_params(args.params, allow_test_params=args.allow_test_params)
    results: dict[str, dict] = {}
    runs = [(n, "") for n in args.backends.split(",")]
    if args.compile and "native" in args.backends.split(","):
        runs.append(("native", "compiled"))
    if args.cuda_graphs and "native" in args.backends.split(","):
        if not args.device.startswith("cuda"):
            raise SystemExit("--cuda-graphs needs --device cuda")
        runs.append(("native", "graphs"))
    for name, variant in runs:
        device = args.device if name == "native" else "cpu"
        label = f"{name}_{variant}" if variant else name
        res = run_backend(name, params, device, args.repeat, args.hoist, variant == "compiled", variant == "graphs")
        results[f"{label}.{device}"] = res
        for op, v in res.items():
            print(f"figure he.{op}_ms.{label}.{device} {v:.6g}", flush=True)
    if "seal.cpu" in results:
        for key, res in results.items():
            if key != "seal.cpu":
                for op, v in res.items():
                    ratio = v / results["seal.cpu"][op]
                    print(f"figure he.{op}_ratio_vs_seal.{key} {ratio:.4g}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"params": params.id, "repeat": args.repeat, "hoist": args.hoist, "results": results},
                      f, indent=2)


if __name__ == "__main__":
    main()
