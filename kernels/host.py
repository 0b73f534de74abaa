"""Host data to the device without waiting for it.

A copy from pageable host memory synchronizes its stream first (CUDA stages such a copy only
once the stream's earlier work is done), so an engine step prepared while the previous one runs
would wait for it at its first small copy, and so would the protected path's uploads,
randomness and kernel address tables (``ckks_ops``) behind its queued kernels. From pinned
memory the copy is queued behind that work and the host goes on; PyTorch's pinned-memory cache
keeps the buffer until the copy has run.
"""

from __future__ import annotations

import torch


def to_device(x: torch.Tensor | list, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x`` (a host tensor, or a list made into one of ``dtype``) on ``device``: queued through
    pinned memory on CUDA, ``x`` itself elsewhere."""
    t = x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=dtype)
    device = torch.device(device)
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)
