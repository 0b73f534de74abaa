"""Keys, products and refresh of the HE layer on one parameter set:
``python -m veil.benchmarks.he_microbench [--backend seal]``.

Prints one ``figure he.<metric> <value>`` line per number (seconds or bytes); wall-clock
medians of ``--repeat`` runs. Products are the generic ones of ``veil.crypto.linear``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from veil.crypto.backend import make_backend
from veil.crypto.linear import encode_matrix, matvec, plan_matvec, replicate_input
from veil.crypto.params import get_params


def _time(fn, repeat: int):
    times = []
    out = None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="ckks-n16384-l6-v1")
    ap.add_argument("--allow-test-params", action="store_true")
    ap.add_argument("--rows", type=int, default=576)
    ap.add_argument("--cols", type=int, default=576)
    ap.add_argument("--levels", type=str, default="", help="comma list; default top and 2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--layouts", type=str, default="bsgs,folded")
    ap.add_argument("--backend", default="seal")
    args = ap.parse_args(argv)

    p = get_params(args.params, allow_test_params=args.allow_test_params)
    levels = [int(x) for x in args.levels.split(",")] if args.levels else [p.top_level, 2]
    fig = lambda k, v: print(f"figure he.{k} {v:.6g}", flush=True)  # noqa: E731

    def backend():
        return make_backend(p, args.backend, allow_test_backends=args.allow_test_params)

    client, server = backend(), backend()
    layouts = args.layouts.split(",")
    plans = {lay: plan_matvec(args.rows, args.cols, p.slot_count, lay) for lay in layouts}
    steps = sorted(set().union(*(pl.rotation_steps for pl in plans.values())))
    t = time.perf_counter()
    client.generate_keys(steps)
    fig("keygen_secret_public_s", time.perf_counter() - t)
    t = time.perf_counter()
    mat = client.export_public_material()
    fig("keygen_export_eval_keys_s", time.perf_counter() - t)
    fig("galois_keys", len(steps))
    fig("galois_keys_bytes", len(mat.galois_keys))
    fig("galois_key_bytes_each", len(mat.galois_keys) / max(1, len(steps)))
    fig("relin_keys_bytes", len(mat.relin_keys))
    fig("public_key_bytes", len(mat.public_key))
    t = time.perf_counter()
    server.import_public_material(mat)
    fig("import_public_material_s", time.perf_counter() - t)

    rng = np.random.default_rng(0)
    x = rng.standard_normal(args.cols)
    xr = replicate_input(x, p.slot_count)
    dt, ct = _time(lambda: client.encrypt(xr), args.repeat)
    fig("encrypt_s", dt)
    dt, up = _time(lambda: client.encrypt_to_bytes(xr), args.repeat)
    fig("encrypt_seeded_bytes_s", dt)
    fig("upload_seeded_bytes", len(up))
    fig("ciphertext_top_bytes", len(server.serialize(ct)))
    dt, _ = _time(lambda: client.decrypt(ct), args.repeat)
    fig("decrypt_s", dt)

    w = rng.standard_normal((args.rows, args.cols)) / np.sqrt(args.cols)
    ref = w @ x
    for level in levels:
        c = server.mod_switch_to(ct, level)
        dt, _ = _time(lambda c=c: server.rotate(c, 1), args.repeat)
        fig(f"rotate_s.l{level}", dt)
        for lay in layouts:
            tag = f"{lay}.{args.rows}x{args.cols}.l{level}"
            fig(f"rotations.{tag}", plans[lay].rotations)
            t = time.perf_counter()
            m = encode_matrix(server, w, level, layout=lay)
            fig(f"encode_matrix_s.{tag}", time.perf_counter() - t)
            fig(f"encoded_matrix_bytes.{tag}", m.nbytes)
            dt, _ = _time(lambda c=c, m=m: server.rotate_many(c, range(1, m.plan.n1)), args.repeat)
            fig(f"baby_steps_s.{tag}", dt)
            dt, y = _time(lambda m=m, c=c: matvec(server, m, c), args.repeat)
            fig(f"matvec_s.{tag}", dt)
            err = np.abs(client.decrypt(y, args.rows) - ref).max()
            fig(f"matvec_max_abs_err.{tag}", err)
            del m
        dt, _ = _time(lambda y=y: server.rerandomize(y), args.repeat)
        fig(f"rerandomize_flood_s.l{level - 1}", dt)
        fig(f"ciphertext_bytes.l{level - 1}", len(server.serialize(y)))

    mask_level = p.min_mask_level()
    c = server.mod_switch_to(ct, mask_level)
    dt, (mc, mask) = _time(lambda: server.mask_for_refresh(c), args.repeat)
    fig(f"refresh_mask_s.l{mask_level}", dt)
    dt, up = _time(lambda: client.refresh_reencrypt_to_bytes(mc), args.repeat)
    fig("refresh_client_reencrypt_s", dt)
    rc = server.deserialize(up, level=p.top_level)
    dt, out = _time(lambda: server.unmask_refresh(rc, mask), args.repeat)
    fig("refresh_unmask_s", dt)
    fig("refresh_max_abs_err", np.abs(client.decrypt(out, args.cols) - x).max())
    blob = server.serialize(mc)
    dt, _ = _time(lambda: server.deserialize(blob, level=mask_level), args.repeat)
    fig(f"deserialize_s.l{mask_level}", dt)
    dt, _ = _time(lambda: server.serialize(mc), args.repeat)
    fig(f"serialize_s.l{mask_level}", dt)
    fig(f"ciphertext_bytes.l{mask_level}", len(blob))
    low = server.mod_switch_to(ct, 0)
    fig("ciphertext_bytes.l0", len(server.serialize(low)))


if __name__ == "__main__":
    main()
