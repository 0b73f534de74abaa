"""How far the flooding noise sits above what the computation leaves in each download:
``python -m veil.benchmarks.flooding_margin [--layers 2,12,28] [--positions 9]``.

Every ciphertext that leaves the server is re-randomized and flooded with Gaussian noise of std
``2^-FLOOD_BELOW_SCALE`` × sqrt(N/2) ≈ 2^-11.5 absolute per slot. What it must hide is what the
computation leaves where the client looks: in the *masked-out* slots of a download (the slots a
0/1 mask cleaned), the mask's encoding error times the partial sums it cleaned away, plus key
switching and rescale noise — a function of the server's weights. This benchmark runs the real
protocol on SEAL for two-layer ranges starting at each ``--layers`` entry (one session each,
``--positions`` decode positions), decrypts every download *before* it is flooded (a hook on
``Circuit.download``, benchmark only: it needs the client's secret key), and prints per download
kind and layer the largest magnitude in the masked-out slots and the margin
``log2(flood std / that magnitude)`` in bits. The MLP download carries σ'/(8d) in every slot by
design, so its residue is measured against its slot 2F.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.protected import circuits, server
from veil.protected.circuits import FLOOD_BELOW_SCALE, required_rotation_steps
from veil.protected.client import ProtectedClientState
from veil.protected.layouts import dims_of, score_slot
from veil.protected.protocol import MsgKind
from veil.server.config import ServerConfig

PROMPT = "The capital of France is Paris, and the capital of Italy is Rome; the capital of Spain"


def _kept(dims, kind: str, position: int) -> np.ndarray:
    """The slots a download of ``kind`` may carry values in (the rest were masked)."""
    if kind == MsgKind.SCORES:
        idx = [score_slot(dims, p, h) for p in range(position + 1) for h in range(dims.heads)]
        return np.array(sorted(idx + [dims.sigma_slot]))
    if kind == MsgKind.MLP:
        return np.arange(2 * dims.ffn + 1)
    return np.arange(dims.d)  # FINAL


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="2,12,28", help="first layer of each two-layer range")
    ap.add_argument("--positions", type=int, default=9)
    ap.add_argument("--out", type=Path, default=Path("bench_out/flooding_margin.json"))
    args = ap.parse_args(argv)

    from veil.engine.loader import build_model, load_checkpoint

    ckpt = load_checkpoint()
    model, cfg = build_model(ckpt), ckpt.config
    dims = dims_of(cfg, PROTECTED_PARAMS.slot_count)
    client_be = make_backend(PROTECTED_PARAMS, "seal")
    client_be.generate_keys(required_rotation_steps(dims))
    server_be = make_backend(PROTECTED_PARAMS, "seal")
    server_be.import_public_material(client_be.export_public_material())
    flood_std = 2.0**-FLOOD_BELOW_SCALE * math.sqrt(dims.slots)

    seen: list[np.ndarray] = []

    class Recording(circuits.Circuit):  # benchmark-only: the download before it is flooded
        def download(self, ct, level):
            seen.append(client_be.decrypt(ct))
            return super().download(ct, level)

    server.Circuit = Recording
    ids = ckpt.tokenizer(PROMPT, return_tensors="pt")["input_ids"][0][: args.positions]
    results: dict[str, dict] = {}
    for first in (int(x) for x in args.layers.split(",")):
        ex = server.ProtectedExecutor.from_checkpoint(server_be, ckpt, first, first + 2,
                                                      ServerConfig().protected_limits())
        with torch.no_grad():
            h_in = model.run_layers(model.embed(ids), 0, first).double().numpy()
        s = ex.new_session()
        c = ProtectedClientState(client_be, cfg, first, first + 2, s.id)
        for t in range(len(ids)):
            msg = c.token_message(h_in[t])
            while not isinstance(msg, np.ndarray):
                seen.clear()
                reply = ex.handle(msg)
                for vec in seen:
                    if reply.kind == MsgKind.REFRESH:
                        continue  # masked by the refresh mask, not flooded
                    v = vec - vec[2 * dims.ffn] if reply.kind == MsgKind.MLP else vec
                    rest = np.delete(v, _kept(dims, reply.kind, t))
                    key = f"{reply.kind}.l{reply.layer}"
                    r = results.setdefault(key, {"max_residue": 0.0, "max_value": 0.0})
                    r["max_residue"] = max(r["max_residue"], float(np.abs(rest).max()))
                    r["max_value"] = max(r["max_value"], float(np.abs(vec).max()))
                msg = c.handle(reply)
        ex.drop_session(s.id)
        del ex
    print(f"figure flooding.flood_std {flood_std:.6g}")
    for key, r in sorted(results.items()):
        r["margin_bits"] = math.log2(flood_std / max(r["max_residue"], 1e-300))
        print(f"figure flooding.{key}.max_residue {r['max_residue']:.6g}")
        print(f"figure flooding.{key}.margin_bits {r['margin_bits']:.6g}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"flood_std": flood_std, "downloads": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
