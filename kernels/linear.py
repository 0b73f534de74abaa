"""``x @ W.T`` for a fixed weight ``W [out, in]``, laid out once for the device's GEMM.

The engine's matrices are fixed, so their layout is chosen once, at start, for what each
device's GEMM reads fastest. Measured at decode batch sizes (every weight streamed
once per step, so memory traffic sets the pace):

* bf16 on CPU: oneDNN (AMX where present) re-lays a plain weight into its blocked format on
  every call. Prepacking it once (``torch.ops.mkldnn._reorder_linear_weight``, the op torch's
  own compiler uses for frozen CPU weights) and calling the prepacked GEMM gives the same
  numbers faster: 30 cold 3072x576 weights (one step's gate|up) took 0.36 ms per call against
  0.57-0.59 ms at 1-16 rows, 1.08 against 1.92 ms at 256 (Xeon with AMX).
* fp32 on CPU: the same oneDNN prepack, where it works, for every row count. On the 2-core
  Zen 4 EPYC (AVX-512, 2 threads) one step's 120 layer matrices took 29.4 ms against 61.6 ms
  for a contiguous ``[in, out]`` copy at 16 rows, 1.3x at 1 row and 1.25x at 512 (the prepack
  is made for 16 rows and serves any), and the 49152x576 head 7.2 ms against 29.3 ms at 16 rows
  (benchmarks/results/2026-12-03-fp32-prepack). The ``[in, out]`` copy, 1.3-1.7x faster than
  the transposed view, stays where oneDNN refuses. MKL's own prepacked GEMM is tied to one row
  count, so it does not suit batches that change every step.
* CUDA: cuBLAS takes the transposed view as it is.

Tests compare each layout with ``x @ W.T`` on the weight as given.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def onednn_prepacks(dtype: torch.dtype) -> bool:
    """Whether oneDNN can prepack a ``dtype`` weight on this CPU. Its bf16 path needs AVX-512
    (BW, VL, DQ) or AVX-NE-CONVERT, and says so only by raising when asked: on an AVX2-only AMD
    EPYC every bf16 `Linear` raised at start. A weight it refuses stays a plain layout."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), 16)
    except RuntimeError:
        return False
    return True


class Linear:
    """A fixed ``W [out, in]`` applied as ``x [..., in] -> [..., out]`` on ``device``. Only the
    laid-out operand is kept (a concatenated weight, e.g. gate|up, is not held twice)."""

    def __init__(self, w: torch.Tensor, device: torch.device | str, *, batch_hint: int = 16) -> None:
        device = torch.device(device)
        w = w.detach()
        self.out_features, self.in_features = w.shape
        self.packed = self.kn = self.view = None
        cpu = device.type == "cpu"
        if cpu and w.dtype in (torch.bfloat16, torch.float32) and onednn_prepacks(w.dtype):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w.to(device).contiguous(), batch_hint)
        elif cpu and w.dtype == torch.float32:
            self.kn = w.to(device).t().contiguous()  # [in, out]
        else:
            self.view = w.to(device).t()  # [in, out] view of [out, in]

    @property
    def layout(self) -> str:
        return "onednn-packed" if self.packed is not None else "in-out copy" if self.kn is not None else "view"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return x @ (self.kn if self.kn is not None else self.view)
        lead = x.shape[:-1]
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features).contiguous(), self.packed, None,
                                               "none", [], "")
        return y.view(*lead, self.out_features)
