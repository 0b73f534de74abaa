"""Rounded download on the 2-core CPU: serialize a flooded level-1 ciphertext rounded, and load it, per backend (median of 9).
Run: PYTHONPATH=<tree of e561dd8 as veil/> python rounding_cpu.py (before), python rounding_cpu.py (after)."""
import numpy as np, statistics, time, veil.crypto.rounding as R
from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
print("rounding module:", R.__file__)
for name in ("seal", "native"):
    client = make_backend(PROTECTED_PARAMS, name); client.generate_keys({})
    server = make_backend(PROTECTED_PARAMS, name); server.import_public_material(client.export_public_material())
    x = np.linspace(-1, 1, PROTECTED_PARAMS.slot_count)
    ct = server.deserialize(client.encrypt_to_bytes(x))
    down = server.rerandomize(server.mod_switch_to(ct, 1))
    floor = float(np.log2(server.scale(down))) - 18
    blob = server.serialize(down, noise_log2=floor)
    def med(f, n=9):
        ts=[]
        for _ in range(n):
            t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
        return statistics.median(ts)*1e3
    print(f"{name}: round_download {med(lambda: server.serialize(down, noise_log2=floor)):.2f} ms, unround_download {med(lambda: client.deserialize(blob)):.2f} ms, bytes {len(blob)}")
    back = client.decrypt(client.deserialize(blob))
    print("  max err", float(np.max(np.abs(np.asarray(back)[:x.size]-x))))
