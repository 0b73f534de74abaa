"""One protected layer's server work on the CUDA code path, counted on the CPU
(``../2026-11-28-ntt-launches/layer_count.py``: ``protected_bench``, native, layers 10-11,
context 16, every Triton launcher a counter around its twin), with ``mac_many_triton`` counted
too, and the bytes that ``torch.stack`` copies from the server's Python (a product's terms and
weights stacked for the ct x pt kernels) added up per layer.

    cd benchmarks/results/2026-12-07-mac-rows
    PYTHONSAFEPATH=1 python census.py            # this commit: a product's giant steps in one launch
    PYTHONSAFEPATH=1 python census.py --before   # the code before it: a `mac` launch per giant step,
                                                 # a batch's per-row operands on the twin, zero checks per step

On CPU tensors ``rns.mac_many`` took its CPU branch even with the CUDA dispatch forced (the C
kernel's twin, uncounted), so the earlier censuses (``../2026-11-28-ntt-launches``,
``../2026-12-06-op-graphs``) left a product's giant steps out; ``--before`` runs the CUDA
branch as it was.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-11-28-ntt-launches"))
import layer_count  # noqa: E402  (first: it turns the C kernels off and patches the launchers)
import torch  # noqa: E402

from veil.kernels import ckks_ops  # noqa: E402


def _rows_twin(a, rows, basis, layout=None):
    outs = []
    for row in rows:
        keep = [k for k, w in enumerate(row) if w is not None]
        outs.append(ckks_ops.mac_torch(a[keep], [row[k] for k in keep], basis))
    return torch.stack(outs)


ckks_ops.mac_many_triton = layer_count.counted("mac_rows", lambda *a: 1, _rows_twin)
_mac_before = ckks_ops.mac  # layer_count's stand-in for the CUDA branch of ckks_ops.mac before this commit


def mac_now(a, w, basis):
    """``ckks_ops.mac``'s CUDA branch as of this commit (its CPU test, which CPU tensors would
    take, left out as layer_count's stand-in does): a batch's per-row operands (ct x ct's
    polynomials, per-session plaintexts) through the rows kernel, not the twin."""
    layout = None if all(x.dim() == 2 for x in w) else ckks_ops.rows_kernel_layout(a, w)
    if layout is not None:
        return ckks_ops.mac_many_triton(a if torch.is_tensor(a) else torch.stack(list(a)), [list(w)], basis, layout)[0]
    return _mac_before(a, w, basis)


ckks_ops.mac = mac_now
if "--before" in sys.argv:
    ckks_ops.mac = _mac_before  # rns.mac_many's CUDA branch before this commit: a `mac` per row (giant step)
    from veil.crypto.native import rns

    def mac_many_before(a, rows, basis, compile=False):
        return [rns.mac([t for t, w in zip(a, row, strict=True) if w is not None], [w for w in row if w is not None],
                        basis, compile) for row in rows]

    rns.mac_many = mac_many_before

    def mul_plain_before(c, m, basis):  # a batch's per-session plaintexts: the twin
        if ckks_ops.kernel_takes_mac([c], [m]):
            return ckks_ops.mac(c.unsqueeze(0), m.unsqueeze(0), basis)
        return basis.mul(c, m)

    rns.mul_plain = mul_plain_before
    from veil.crypto.native.batch import NativeBatch

    _stack_plain = NativeBatch.stack_plain

    def stack_plain_before(self, pts):  # no zero checks from the rows: each product checks again
        out = _stack_plain(self, pts)
        out.nonzero = out.row_nonzero = None
        return out

    NativeBatch.stack_plain = stack_plain_before

stacked = {"bytes": 0, "calls": 0}
_stack = torch.stack


def stack(tensors, *a, **kw):
    out = _stack(tensors, *a, **kw)
    if layer_count.state["server"] and not layer_count.state["inside"]:
        stacked["bytes"] += out.numel() * out.element_size()
        stacked["calls"] += 1
    return out


torch.stack = stack
_handle = layer_count.ProtectedExecutor.handle
per_msg = []


def handle(self, msg):
    stacked.update(bytes=0, calls=0)
    try:
        return _handle(self, msg)
    finally:
        per_msg.append(dict(stacked))


layer_count.ProtectedExecutor.handle = handle
if __name__ == "__main__":
    layer_count.main([a for a in sys.argv[1:] if a != "--before"])
    layer = per_msg[-3:]  # the first layer's cycle, as layer_count counts it
    print(f"# one layer: torch.stack from the server's Python {sum(m['calls'] for m in layer)} calls, "
          f"{sum(m['bytes'] for m in layer) / 1e6:.1f} MB")
