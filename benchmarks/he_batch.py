"""What batching buys the native backend: one call over B ciphertexts against one call per
ciphertext. ``python -m veil.benchmarks.he_batch [--device cuda] [--batches 1,4,16,64]``.

The native backend's kernels take leading batch dimensions (``[..., 2, limbs, N]``), so B
sessions' ciphertexts at the same step can go through one NTT, one plaintext product and one key
switch. Timed at the top level of the protected parameter set, on server-side ciphertexts
(fresh uploads) and one rotation key: ``ntt`` (forward NTT of both polynomials), ``ct_x_pt``
(product with one shared encoded plaintext, the weights' case) and ``rotate``. Rows that would
use different sessions' keys need the key gathered per row (not built: issue 19); with one key
the key-switch arithmetic is the same. Each batched result is checked bit for bit against the
unbatched one of its first row. Prints ``figure he_batch.<op>_ms_per_ct.b<B>.<device>`` and
``figure he_batch.<op>_speedup.b<B>.<device>`` (per-ciphertext time at B=1 over that at B).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from veil.benchmarks.he_ops import _median_ms
from veil.crypto.backend import make_backend
from veil.crypto.native import keyswitch
from veil.crypto.params import PROTECTED_PARAMS


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    params, dev = PROTECTED_PARAMS, args.device
    client = make_backend(params, "native")
    client.generate_keys([1])
    server = make_backend(params, "native", device=dev)
    server.import_public_material(client.export_public_material())
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    top, rng = params.top_level, np.random.default_rng(0)
    batches = [int(b) for b in args.batches.split(",")]
    cts = [server.deserialize(client.encrypt_to_bytes(rng.uniform(-1, 1, params.slot_count)))
           for _ in range(min(max(batches), 8))]
    pt = server.encode(rng.uniform(-1, 1, params.slot_count), top, server.prime(top))._obj
    ctx = server._ctx
    basis, ntt = ctx.data(top)
    g, key = server._galois_key(1)
    ops = {
        "ntt": lambda x: ntt.forward(x),
        "ct_x_pt": lambda x: basis.mul(x, pt),
        "rotate": lambda x: keyswitch.rotate(x, g, key, ctx, top),
    }
    results: dict[str, dict[int, float]] = {op: {} for op in ops}
    for b in batches:
        x = torch.stack([cts[i % len(cts)]._obj.data for i in range(b)])  # [B, 2, limbs, N]
        for op, fn in ops.items():
            if not torch.equal(fn(x)[0], fn(x[0])):
                raise SystemExit(f"batched {op} differs from unbatched")
            ms = _median_ms(lambda fn=fn, x=x: fn(x), args.repeat, sync)
            results[op][b] = ms / b
            print(f"figure he_batch.{op}_ms_per_ct.b{b}.{dev} {ms / b:.6g}", flush=True)
    for op, per in results.items():
        for b, v in per.items():
            print(f"figure he_batch.{op}_speedup.b{b}.{dev} {per[batches[0]] / v:.4g}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"params": params.id, "device": dev, "ms_per_ciphertext": results}, f, indent=2)


if __name__ == "__main__":
    main()
