"""Triton kernels of the inference engine, each with a pure-torch reference twin.

Import the public ops from here (or ``veil.kernels.ops``): they run Triton on CUDA tensors
and the torch twin on CPU. The per-kernel modules hold the ``@triton.jit`` kernel, its
launcher ``*_triton`` and its twin ``*_torch``.
"""

from veil.kernels.ops import (
    DEFAULT_PARTITION_SIZE,
    add_rms_norm,
    apply_rope,
    build_rope_cache,
    paged_decode_attention,
    paged_prefill_attention,
    rms_norm,
    silu_and_mul,
    store_kv,
)

__all__ = [
    "DEFAULT_PARTITION_SIZE",
    "add_rms_norm",
    "apply_rope",
    "build_rope_cache",
    "paged_decode_attention",
    "paged_prefill_attention",
    "rms_norm",
    "silu_and_mul",
    "store_kv",
]
