"""Triton kernels of the inference engine, each with a pure-torch reference twin.

Import the public ops from here (or ``veil.kernels.ops``): they run Triton on CUDA tensors,
the C kernels of ``llama_cpu`` on CPU tensors where a C compiler built them (``cbuild``), and
the torch twin otherwise. The per-kernel modules hold the ``@triton.jit`` kernel, its launcher
``*_triton`` and its twin ``*_torch``.

The native CKKS backend's kernels (``ckks_ntt``, ``ckks_ops``, on the products of
``ckks_arith``) are dispatched from ``veil.crypto.native`` (``ntt``, ``rns``); ``mac`` and
``sub_mul_const`` pick kernel or twin by device like the ops above. The CPU kernels are C,
not Triton: ``ckks_cpu`` (the NTT and the multiply-accumulate of ``dot_plain``, ct×pt and key
switching, for CPU tensors; compiled on first use where a C compiler exists).
"""

from veil.kernels.ckks_ntt import ntt_triton
from veil.kernels.ckks_ops import key_inner_triton, mac, sub_mul_const
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
    "key_inner_triton",
    "mac",
    "ntt_triton",
    "paged_decode_attention",
    "paged_prefill_attention",
    "rms_norm",
    "silu_and_mul",
    "store_kv",
    "sub_mul_const",
]
