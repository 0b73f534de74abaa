"""What a native HE operation launches on the CUDA code path, counted on the CPU: the Triton
kernels (run by the interpreter, ``use_triton`` forced on) and the torch ops outside them (each
a kernel launch, or at least a dispatch, on a GPU). Level 7, the protected parameter set.

    python benchmarks/results/2026-11-28-gpu/launch_census.py [op ...]
"""

import collections
import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"
os.environ["VEIL_CPU_KERNELS"] = "0"

import numpy as np  # noqa: E402
import triton.runtime.interpreter as interp  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from veil.crypto.backend import make_backend  # noqa: E402
from veil.crypto.native import keyswitch, ntt, rns  # noqa: E402
from veil.crypto.params import PROTECTED_PARAMS as P  # noqa: E402
from veil.kernels import ckks_arith, ckks_ops  # noqa: E402

for module in (rns, ntt, keyswitch, ckks_ops, ckks_arith):
    module.use_triton = lambda t: True  # the CUDA path's dispatch, on CPU tensors

launches: collections.Counter = collections.Counter()
ops: collections.Counter = collections.Counter()
depth = [0]
_run = interp.InterpretedFunction.run


def _counted_run(self, *args, **kwargs):
    launches[self.fn.__name__] += 1
    depth[0] += 1
    try:
        return _run(self, *args, **kwargs)
    finally:
        depth[0] -= 1


interp.InterpretedFunction.run = _counted_run


class TorchOps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not depth[0]:  # outside a Triton kernel
            ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


client = make_backend(P, "native")
client.generate_keys({s: 7 for s in range(1, 17)}, 7)
server = make_backend(P, "native")
server.import_public_material(client.export_public_material())
x, y = (server.deserialize(client.encrypt_to_bytes(np.ones(8))) for _ in range(2))
pt = server.encode(np.ones(8), level=7)
cases = {
    "rescale": lambda: server.rescale(server.multiply_plain(x, pt, rescale=False)),
    "multiply_plain": lambda: server.multiply_plain(x, pt),
    "rotate": lambda: server.rotate(x, 1),
    "rotate_many16": lambda: server.rotate_many(x, list(range(1, 17))),
    "multiply_relin": lambda: server.multiply(x, y),
}
for name, op in cases.items():
    if len(sys.argv) > 1 and name not in sys.argv[1:]:
        continue
    launches.clear()
    ops.clear()
    t = time.time()
    with TorchOps():
        op()
    print(f"{name}: {sum(launches.values())} Triton launches {dict(launches)}; {sum(ops.values())} torch ops "
          f"outside them; top {ops.most_common(8)} ({time.time() - t:.0f} s)", flush=True)
