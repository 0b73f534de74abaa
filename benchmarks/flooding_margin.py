"""How far the flooding noise sits above what the computation leaves in each download:
``python -m veil.benchmarks.flooding_margin [--layers 2,12,28] [--positions 9] [--he-backend seal|native]``.

Every ciphertext that leaves the server is re-randomized and flooded with Gaussian noise of std
``2^-FLOOD_BELOW_SCALE`` × sqrt(N/2) ≈ 2^-11.5 absolute per slot. What it must hide is what the
computation leaves where the client looks: in the *masked-out* slots of a download (the slots a
0/1 mask cleaned), the mask's encoding error times the partial sums it cleaned away, plus key
switching and rescale noise — a function of the server's weights. This benchmark runs the real
protocol on SEAL (or ``--he-backend native``) for two-layer ranges starting at each ``--layers`` entry (one session each,
``--positions`` decode positions), decrypts every download *before* it is flooded (a hook on
``Circuit.download``, benchmark only: it needs the client's secret key), and prints per download
kind and layer the largest magnitude in the masked-out slots and the margin
``log2(flood std / that magnitude)`` in bits (mask residues and CKKS noise together: the
rescale that lands a download at scale 2^36 leaves ~2^-21 of rounding noise in every slot, which
depends on the ciphertexts' fresh randomness, not on the weights). The scores and MLP downloads
carry σ/(8d) and σ'/(8d) in every slot by design, so their residues are measured against slot
d and slot 2F. A folded download (the MLP one, whose client sent a fold key:
``crypto/ring_switch.py``) is recorded as the client decrypts it, slot j plus slot j + S/2, its
flooding noise per slot the same. Separately,
for every 0/1 mask (by its key: ``first_2f`` cleans the MLP download), the mask's own residue
|ε_k · x_k| over the slots it zeroes, from its decoded encoding error ε (the backend decodes the
plaintext) and the decrypted input x, and its margin under the flooding noise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from pathlib import Path

import numpy as np
import torch

from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS, get_params
from veil.protected import circuits, server
from veil.protected.circuits import FLOOD_BELOW_SCALE
from veil.protected.client import ProtectedClientState
from veil.protected.key_levels import relin_key_level, rotation_key_levels
from veil.protected.layouts import SCORES_DIV, dims_of, score_slot
from veil.protected.protocol import MsgKind
from veil.server.config import ServerConfig

PROMPT = "The capital of France is Paris, and the capital of Italy is Rome; the capital of Spain"


#: Masks whose output a constant scales before it leaves: their residues are recorded in the
#: download's units (the score masks land on 2^62 and a constant 1/SCORES_DIV follows).
AFTER_MASK = {"scores": 1.0 / SCORES_DIV}
#: Downloads that carry a norm statistic in every slot (σ/(8d), σ'/(8d)): the slot it is read at.
BASE_SLOT = {MsgKind.SCORES: lambda dims: dims.sigma_slot, MsgKind.MLP: lambda dims: dims.sigma2_slot}


def kept_slots(dims, kind: str, position: int, size: int) -> np.ndarray:
    """The slots a download of ``kind`` may carry values in (the rest were masked), in a vector
    of ``size`` slots (S/2 where it was folded)."""
    if kind == MsgKind.SCORES:
        idx = [score_slot(dims, p, h) for p in range(position + 1) for h in range(dims.heads)]
        return np.unique(np.array(idx + [dims.sigma_slot]) % size)
    if kind == MsgKind.MLP:
        return np.arange(2 * dims.ffn + 1)
    return np.arange(dims.d)  # FINAL


def flood_std(dims) -> float:
    """Std of the flooding noise per slot after decoding: 2^-FLOOD_BELOW_SCALE * sqrt(N/2)."""
    return 2.0**-FLOOD_BELOW_SCALE * math.sqrt(dims.slots)


@contextlib.contextmanager
def recording_downloads(client_be, seen: list, masks: dict | None = None):
    """Benchmark and test hook: every ciphertext the executor prepares for download is also
    decrypted, before it is flooded, into ``seen`` (needs the client's secret key). With
    ``masks`` (SEAL and native: they decode plaintexts), every 0/1 mask's residue is recorded per mask
    key: the largest |ε_k · x_k| over the slots k the mask zeroes, with ε the mask plaintext's
    encoding error (decoded minus intended) and x the decrypted input it multiplies: what the
    mask leaves of the values it was meant to clean, apart from CKKS noise, in the units of the
    download (``AFTER_MASK``)."""

    class Recording(circuits.Circuit):
        def download(self, ct, level, fold=False):
            v = client_be.decrypt(ct)
            half = v.size // 2
            seen.append(v[:half] + v[half:] if fold else v)  # what the client decrypts, less the noise
            return super().download(ct, level, fold)

        def select(self, ct, key, make, target=None):
            out = super().select(ct, key, make, target)
            if masks is not None:
                be, level = self.be, self.be.level(ct)
                scale = (be.params.scale if target is None else target) * be.prime(level) / be.scale(ct)
                values = make()
                eps = be.inner.decode_plaintext(self.consts.get(be, key, make, level, scale)) - values
                zeroed = values == 0
                r = float(np.abs(eps[zeroed] * client_be.decrypt(ct)[zeroed]).max()) if zeroed.any() else 0.0
                name = key if isinstance(key, str) else key[0]
                masks[name] = max(masks.get(name, 0.0), r * AFTER_MASK.get(name, 1.0))
            return out

    saved, server.Circuit = server.Circuit, Recording
    try:
        yield
    finally:
        server.Circuit = saved


def residues(ex, client: ProtectedClientState, client_be, h_rows: np.ndarray, results: dict,
             masks: dict | None = None) -> dict:
    """Decode ``h_rows`` one position at a time through ``ex``; per download kind and layer, the
    largest magnitude in the masked-out slots before flooding (``BASE_SLOT``'s downloads against
    the slot of the norm statistic they carry in every slot): mask residues and CKKS noise.
    ``masks``: see ``recording_downloads``."""
    dims, seen = ex.dims, []
    with recording_downloads(client_be, seen, masks):
        for row in h_rows:
            t = client.position
            msg = client.token_message(row)
            while not isinstance(msg, np.ndarray):
                seen.clear()
                reply = ex.handle(msg)
                if reply.kind != MsgKind.REFRESH:  # masked by the refresh mask, not flooded
                    for vec in seen:
                        v = vec - vec[BASE_SLOT[reply.kind](dims)] if reply.kind in BASE_SLOT else vec
                        rest = np.abs(np.delete(v, kept_slots(dims, reply.kind, t, v.size))).max()
                        r = results.setdefault(f"{reply.kind}.l{reply.layer}", {"max_residue": 0.0})
                        r["max_residue"] = max(r["max_residue"], float(rest))
                msg = client.handle(reply)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="2,12,28", help="first layer of each two-layer range")
    ap.add_argument("--positions", type=int, default=9)
    ap.add_argument("--params", default=PROTECTED_PARAMS.id, help="a production parameter set with the same levels")
    ap.add_argument("--he-backend", choices=("seal", "native"), default="seal")
    ap.add_argument("--out", type=Path, default=Path("bench_out/flooding_margin.json"))
    args = ap.parse_args(argv)

    from veil.engine.loader import build_model, load_checkpoint

    ckpt = load_checkpoint()
    model, cfg = build_model(ckpt), ckpt.config
    params = get_params(args.params)
    dims = dims_of(cfg, params.slot_count)
    client_be = make_backend(params, args.he_backend)
    client_be.generate_keys(rotation_key_levels(dims), relin_key_level())
    server_be = make_backend(params, args.he_backend)
    server_be.import_public_material(client_be.export_public_material())
    std = flood_std(dims)
    ids = ckpt.tokenizer(PROMPT, return_tensors="pt")["input_ids"][0][: args.positions]
    results: dict[str, dict] = {}
    masks: dict[str, float] = {}
    for first in (int(x) for x in args.layers.split(",")):
        ex = server.ProtectedExecutor.from_checkpoint(server_be, ckpt, first, first + 2,
                                                      ServerConfig().protected_limits())
        with torch.no_grad():
            h_in = model.run_layers(model.embed(ids), 0, first).double().numpy()
        s = ex.new_session()
        residues(ex, ProtectedClientState(client_be, cfg, first, first + 2, s.id), client_be, h_in, results, masks)
        ex.drop_session(s.id)
        del ex
    print(f"figure flooding.flood_std {std:.6g}")
    for key, r in sorted(results.items()):
        r["margin_bits"] = math.log2(std / max(r["max_residue"], 1e-300))
        print(f"figure flooding.{key}.max_residue {r['max_residue']:.6g}")
        print(f"figure flooding.{key}.margin_bits {r['margin_bits']:.6g}")
    # a mask that zeroes no slot (a constant, the ones of the refresh) leaves no residue: no margin
    mask_margins = {k: math.log2(std / v) if v > 0 else None for k, v in masks.items()}
    for key in sorted(masks):
        print(f"figure flooding.mask.{key}.residue {masks[key]:.6g}")
        if mask_margins[key] is not None:
            print(f"figure flooding.mask.{key}.margin_bits {mask_margins[key]:.6g}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"params": params.id, "he_backend": args.he_backend, "flood_std": std, "downloads": results,
                                    "mask_residues": masks, "mask_margin_bits": mask_margins}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
