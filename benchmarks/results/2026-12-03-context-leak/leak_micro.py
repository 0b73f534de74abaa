"""Server backends made and dropped in turn, as a server does for key uploads it refuses: each
imports one client's public material, deserializes a ciphertext, rotates it (hoisted and
single), and is dropped; after each, the bytes of every live CPU tensor (after gc) and the
process's peak RSS.

    python benchmarks/results/2026-12-03-context-leak/leak_micro.py
"""

import gc
import resource

import numpy as np
import torch

from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS


def live_mb() -> float:
    gc.collect()
    storages = {}
    for o in gc.get_objects():
        if type(o) is torch.Tensor or isinstance(o, torch.nn.Parameter):
            storages[o.untyped_storage().data_ptr()] = o.untyped_storage().nbytes()
    return sum(storages.values()) / 1e6


client = make_backend(PROTECTED_PARAMS, "native")
client.generate_keys([1, 2, -4], None)
material = client.export_public_material()
ct_bytes = client.encrypt_to_bytes(np.linspace(-1, 1, PROTECTED_PARAMS.slot_count))
for i in range(6):
    server = make_backend(PROTECTED_PARAMS, "native")
    server.import_public_material(material)
    ct = server.deserialize(ct_bytes)
    out = server.rotate_many(ct, [1, 2]), server.rotate(ct, -4)
    del server, ct, out
    print(f"after backend {i + 1}: live tensors {live_mb():.1f} MB, "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:.0f} MB", flush=True)
