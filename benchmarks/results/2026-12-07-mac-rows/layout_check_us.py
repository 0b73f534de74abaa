"""Host time of checking a product's weights for the rows kernel (288 plaintexts: W_gate|up's
18 giant steps of 16), as the review's mend does it (``ckks_ops._shared_layout``: one pass,
shape, strides, dtype and device) against before it (a set of (shape, strides) in the dispatch,
then a set of (shape, strides, dtype) in the launcher). CPU tensors; the checks read metadata only.

    PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-mac-rows/layout_check_us.py
"""
import time

import torch

from veil.kernels import ckks_ops

ws = [torch.zeros(8, 16384, dtype=torch.int64) for _ in range(288)]
term = torch.Size((2, 8, 16384))


def before():
    len({(w.shape, w.stride()) for w in ws}) == 1 and ckks_ops.mac_many_layout(term, ws[0])
    len({(w.shape, w.stride(), w.dtype) for w in ws}) == 1 and ckks_ops.mac_many_layout(term, ws[0])


def now():
    ckks_ops._shared_layout(term, ws)


for name, fn in (("before", before), ("now", now)) * 2:
    t = time.perf_counter()
    for _ in range(500):
        fn()
    print(f"{name}: {(time.perf_counter() - t) / 500 * 1e6:.1f} us per product")
