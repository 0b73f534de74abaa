"""Launches of a native HE operation on the CUDA code path, counted on the CPU: the Triton
kernels (``use_triton`` forced on; launches recorded, not executed: a count needs shapes, not
values) and the torch ops outside them (each a kernel launch, or at least a dispatch, on a
GPU). Level 7 of the protected parameter set. Runs on any commit since 2026-11-28 (``git
worktree`` + ``PYTHONPATH``), so before and after come from one sitting.

    python benchmarks/results/2026-11-28-ntt-launches/launch_count.py
"""

import collections
import os

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import triton.runtime.interpreter as interp  # noqa: E402
from cuda_dispatch import force_cuda_dispatch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from veil.crypto.backend import make_backend  # noqa: E402
from veil.crypto.native import keyswitch, ntt, rns  # noqa: E402
from veil.crypto.native.batch import NativeBatch  # noqa: E402
from veil.crypto.params import PROTECTED_PARAMS as P  # noqa: E402
from veil.kernels import ckks_arith, ckks_ntt, ckks_ops  # noqa: E402

launches: collections.Counter = collections.Counter()
ops: collections.Counter = collections.Counter()
interp.InterpretedFunction.run = lambda self, *a, **kw: launches.update([self.fn.__name__])


class TorchOps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


steps = list(range(1, 17))
pairs = []
for _ in range(4):
    client = make_backend(P, "native")
    client.generate_keys({s: 7 for s in steps}, 7)
    server = make_backend(P, "native")
    server.import_public_material(client.export_public_material())
    pairs.append((client, server))
client, server = pairs[0]
x, y = (server.deserialize(client.encrypt_to_bytes(np.ones(8))) for _ in range(2))
pt = server.encode(np.ones(8), level=7)
batch = NativeBatch([s for _, s in pairs])
rows = batch.stack([s.deserialize(c.encrypt_to_bytes(np.ones(8))) for c, s in pairs])
# keys, encryptions and imports above ran on the CPU path; from here on the CUDA path's
# dispatch, on CPU tensors (the C kernels off), with its kernels recorded and skipped
os.environ["VEIL_CPU_KERNELS"] = "0"
force_cuda_dispatch(rns, ntt, keyswitch, ckks_ops, ckks_arith)
for module in (ckks_ntt, ckks_ops):
    module.check_triton_device = lambda *t: None
cases = {
    "rescale": lambda: server.rescale(server.multiply_plain(x, pt, rescale=False)),
    "multiply_plain": lambda: server.multiply_plain(x, pt),
    "rotate": lambda: server.rotate(x, 1),
    "rotate_many16": lambda: server.rotate_many(x, steps),
    "multiply_relin": lambda: server.multiply(x, y),
    "batch4_rotate_many16": lambda: batch.rotate_many(rows, steps),
}
for name, op in cases.items():
    op()  # tables, views and packs built once, as on a warm server
    launches.clear()
    ops.clear()
    with TorchOps():
        op()
    print(f"{name}: {sum(launches.values())} Triton launches {dict(sorted(launches.items()))}; "
          f"{sum(ops.values())} torch ops; top {ops.most_common(5)}", flush=True)
