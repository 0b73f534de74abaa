"""ct x ct on the native CPU backend at levels 4 and 2 (the scores' and h²'s levels), median of 7
batches of 10, ms: the tensor product alone, and with its relinearization."""
import time

import numpy as np

from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS as P

client = make_backend(P, "native")
client.generate_keys({1: 7}, 7)
server = make_backend(P, "native")
server.import_public_material(client.export_public_material())
for level in (4, 2):
    x, y = (server.mod_switch_to(server.deserialize(client.encrypt_to_bytes(np.ones(8))), level) for _ in range(2))
    for name, relin in (("tensor product", False), ("with relinearization", True)):
        def op():
            return server.multiply(x, y, rescale=False, relinearize=relin)
        op()
        times = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(10):
                op()
            times.append((time.perf_counter() - t) / 10 * 1e3)
        print(f"figure ctct.level{level}.{'relin' if relin else 'product'}_ms {sorted(times)[3]:.4g}  # {name}")
