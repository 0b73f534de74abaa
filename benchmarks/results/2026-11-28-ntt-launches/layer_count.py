"""Launches of one protected layer's server work on the CUDA code path, counted on the CPU:
``protected_bench`` (native backend, one decode step at context 16 through layers 10 and 11 of
the shipped model) with ``use_triton`` forced on and every Triton launcher replaced by a
counter that computes with the kernel's twin (the same dispatch and shapes as on a GPU; the
C kernels off), after one untimed step (a warm server). Runs on 975c8ad too (``PYTHONPATH``). Per upload kind of the first layer's cycle: Triton launches by kernel and torch
ops outside them (each a kernel or at least a dispatch on a GPU), the server's own only.

    python benchmarks/results/2026-11-28-ntt-launches/layer_count.py

``on_op`` (functions of each counted op's ``func``) and ``main`` let another census reuse this one
(``../2026-12-06-cuda-ops/layer_sites.py``: the ops by call site); run as a script it is unchanged.
"""

import collections
import os
import sys

os.environ["VEIL_CPU_KERNELS"] = "0"

from cuda_dispatch import force_cuda_dispatch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from veil.benchmarks import protected_bench  # noqa: E402
from veil.crypto.native import ntt, rns  # noqa: E402
from veil.kernels import ckks_arith, ckks_ntt, ckks_ops  # noqa: E402
from veil.protected.server import ProtectedExecutor  # noqa: E402

launches: collections.Counter = collections.Counter()
ops: collections.Counter = collections.Counter()
state = {"server": False, "inside": 0}
on_op: list = []  # called with each counted op's func (see the docstring)


def counted(name, count, twin):
    def launcher(*args, **kw):
        if state["server"]:
            launches[name] += count(*args, **kw)
        state["inside"] += 1
        try:
            return twin(*args, **kw)
        finally:
            state["inside"] -= 1
    return launcher


def _ntt(tables, x, inverse, centre=False, lift=False):
    if lift:
        x = tables.basis.reduce(x.unsqueeze(-2))
    out = tables.twin(x, inverse)
    return tables.basis.center(out) if centre else out


def _key_sets(d, sets, basis):
    import torch
    rows = [[rns._key_inner(d, ks[0], basis)] if len(ks) == 1 else
            [torch.stack([rns._key_inner(x, k, basis) for x, k in zip(d.unbind(0), ks, strict=True)])]
            for ks in sets]
    return torch.stack([r[0] for r in rows])


# before 2026-11-28 (no NttPack): two stages per launch and a launch per run of limbs
per_run = not hasattr(ckks_ntt, "NttPack")
if per_run:
    stages = lambda tables, x, inverse: len(tables.runs) * -(-(tables.n.bit_length() - 1) // 2)  # noqa: E731
else:
    def stages(tables, x, inverse=False, lift=False, **kw):
        rows = x.numel() // tables.n * (len(tables.basis) if lift else 1)  # rows of limbs
        if rows <= getattr(ckks_ntt, "ONE_LAUNCH_ROWS", -1):
            return 1
        return len(list(ckks_ntt._launches(tables.n.bit_length() - 1)))
ntt.ntt_triton = counted("ntt", stages, _ntt)
rns.key_inner_sets_triton = counted("key_inner", lambda *a: 1, _key_sets)
rns.key_inner_triton = counted("key_inner", lambda d, k, b: len(b.parts) if per_run else 1,
                               lambda d, k, b: rns._key_inner(d, k, b))
mac_spans_runs = "wide_ptr" in ckks_ops._mac_kernel.arg_names  # one launch for all runs since 2026-11-28
ckks_ops.mac_triton = counted("mac", lambda a, w, b: 1 if mac_spans_runs else len(b.parts), ckks_ops.mac_torch)
if hasattr(ckks_ops, "add_triton"):
    ckks_ops.add_triton = counted("add", lambda *a: 1, lambda x, y, b: b.add(x, y))
if hasattr(ckks_ops, "key_inner_sets_triton"):
    ckks_ops.key_inner_sets_triton = rns.key_inner_sets_triton
ckks_ops.sub_mul_const_triton = counted("sub_mul", lambda x, r, c, b, *p, **kw: 1 if hasattr(type(c), "stacked") else len(c.parts), ckks_ops.sub_mul_const_torch)
force_cuda_dispatch(rns, ntt, ckks_ops, ckks_arith)


class TorchOps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if state["server"] and not state["inside"]:
            ops[str(func.overloadpacket)] += 1
            for hook in on_op:
                hook(func)
        return func(*args, **(kwargs or {}))


_handle = ProtectedExecutor.handle
rows = []


def handle(self, msg):
    launches.clear()
    ops.clear()
    state["server"] = True
    try:
        with TorchOps():
            return _handle(self, msg)
    finally:
        state["server"] = False
        rows.append((str(msg.kind), msg.layer, dict(launches), sum(launches.values()), sum(ops.values()),
                     ops.most_common(6)))


ProtectedExecutor.handle = handle


def main(argv: list[str]) -> None:
    protected_bench.main(["--he-backend", "native", "--contexts", "16", "--warmup", *argv])
    for kind, layer, by_kernel, total, n_ops, top in rows[-4:]:
        print(f"# {kind} layer {layer}: {total} Triton launches {by_kernel}; {n_ops} torch ops; top {top}")
    layer = rows[-3:]  # the first layer's cycle: weights, mlp_in, refreshed (as protected_bench counts)
    print(f"# one layer: {sum(r[3] for r in layer)} Triton launches, {sum(r[4] for r in layer)} torch ops")


if __name__ == "__main__":
    main(sys.argv[1:])
