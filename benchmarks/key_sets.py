"""What each evaluation-key set weighs on the wire: ``python -m veil.benchmarks.key_sets
[--backends seal,native] [--sets full,compact,minimal] [--out FILE]``.

Why: the setup a protected client uploads once is its public key, its relinearization key and
the Galois keys of ``key_levels.rotation_key_levels`` for the set it picks; the sets trade those
bytes against key switches on the server (docs/PROTOCOL.md, "Keys"; the products' time under
each set is ``protected_products --keys``). For each backend and set this makes the keys as
the SDK does (each Galois key for the levels its rotations run at, the relinearization key for
``relin_key_level``) and prints ``figure keys.<backend>.<set>.<metric>`` lines: the bytes of
``POST /v1/keys`` (``setup_bytes``) and of each part, the number of Galois keys, and the key
generation and export time; JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time

from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.engine.loader import load_checkpoint
from veil.protected.key_levels import KEY_SETS, relin_key_level, rotation_key_levels
from veil.protected.layouts import dims_of
from veil.protected.protocol import public_material_to_bytes


def measure(backend: str, key_set: str, dims) -> dict:
    steps = rotation_key_levels(dims, key_set=key_set)
    client = make_backend(PROTECTED_PARAMS, backend)
    t = time.perf_counter()
    client.generate_keys(steps, relin_key_level())
    material = client.export_public_material()
    seconds = time.perf_counter() - t
    return {"setup_bytes": len(public_material_to_bytes(material)), "public_key_bytes": len(material.public_key),
            "relin_key_bytes": len(material.relin_keys), "galois_key_bytes": len(material.galois_keys),
            "fold_key_bytes": len(material.fold_key), "galois_keys": len(steps), "keygen_s": seconds}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="seal,native")
    ap.add_argument("--sets", default=",".join(KEY_SETS))
    ap.add_argument("--model", help="a .gguf file or a Hugging Face directory (default: the shipped SmolLM2)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    sets = args.sets.split(",")
    if unknown := set(sets) - set(KEY_SETS):
        ap.error(f"unknown key sets {sorted(unknown)}; choose from {KEY_SETS}")
    dims = dims_of(load_checkpoint(args.model).config, PROTECTED_PARAMS.slot_count)
    results: dict = {}
    for backend in args.backends.split(","):
        for key_set in sets:
            res = results.setdefault(backend, {})[key_set] = measure(backend, key_set, dims)
            for k, v in res.items():
                print(f"figure keys.{backend}.{key_set}.{k} {v:.6g}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"schema": "veil.key_sets/1", "param_set": PROTECTED_PARAMS.id, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
