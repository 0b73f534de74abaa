"""The refresh's noise and bytes, whole and folded, on SEAL and native (a measurement script of
this folder, not a benchmark of the package): h'' with slots repeating every S/2 (the hidden
layout) at level 1 on 2^27, masked, sent, re-encrypted by the client at 7, unmasked.

    python benchmarks/results/2026-11-28-folded-refresh/refresh_noise.py
"""

import numpy as np

from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS as P

SCALE, ROUND = 2.0**27, 27.0 - 24.0  # Circuit.refresh_scale, REFRESH_ROUND_BELOW_SCALE
for name in ("seal", "native"):
    client = make_backend(P, name)
    client.generate_keys({1: 0}, 0)
    server = make_backend(P, name)
    server.import_public_material(client.export_public_material())
    print(f"{name}: fold key {len(client.export_public_material().fold_key)} B")
    rng = np.random.default_rng(0)
    for rep in range(3):
        w = np.tile(rng.normal(0.0, 10.0, P.slot_count // 2), 2)
        ct = server.deserialize(client.encrypt_to_bytes(w, 1, SCALE), level=1, scale=SCALE)
        masked, mask = server.mask_for_refresh(ct)
        data = server.serialize(masked, noise_log2=ROUND)
        up = client.refresh_reencrypt_to_bytes(client.deserialize(data, level=1), P.top_level)
        whole = client.decrypt(server.unmask_refresh(server.deserialize(up, scale=SCALE), mask)) - w
        masked, mask = server.mask_for_refresh(ct, fold=True)
        folded = server.serialize_folded_refresh(masked, ROUND)
        up = client.refresh_reencrypt_folded_to_bytes(folded, P.top_level)
        fold = client.decrypt(server.unmask_refresh(server.deserialize(up, scale=SCALE), mask)) - w
        print(f"  run {rep}: whole {len(data)} B, error std {np.std(whole):.3g} max {np.abs(whole).max():.3g}; "
              f"folded {len(folded)} B, error std {np.std(fold):.3g} max {np.abs(fold).max():.3g}")
