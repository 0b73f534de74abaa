"""The CUDA code path's dispatch on CPU tensors, for the two launch censuses of this folder:
``use_triton`` forced on, the C kernels' CPU tests bypassed where they come first."""

import torch

from veil.crypto.native import evaluator
from veil.kernels import ckks_ops


def force_cuda_dispatch(*modules) -> None:
    """``use_triton`` true in ``modules``; ``ckks_ops.mac`` through its CUDA branch (whatever
    ``ckks_ops.mac_triton`` is when called); a batch's hoisting chunk as on CUDA."""
    for module in modules:
        if hasattr(module, "use_triton"):
            module.use_triton = lambda t: True

    def mac_cuda(a, w, basis):
        if all(x.dim() == 2 for x in w):
            return ckks_ops.mac_triton(a if torch.is_tensor(a) else torch.stack(list(a)),
                                       w if torch.is_tensor(w) else torch.stack(list(w)), basis)
        return ckks_ops.mac_torch(a, w, basis)

    ckks_ops.mac = mac_cuda
    if isinstance(evaluator.HOIST_CHUNK, dict):  # since 2026-11-28: a chunk per device type
        evaluator.HOIST_CHUNK["cpu"] = evaluator.HOIST_CHUNK["cuda"]
