"""Small helpers shared by the kernel launchers."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def interpreter_enabled() -> bool:
    """True when Triton runs kernels on CPU through its interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_triton_device(*tensors: torch.Tensor) -> None:
    """Fail early with a clear message instead of Triton's opaque pointer error.

    Triton kernels read raw device pointers: the tensors must be on CUDA, unless the
    interpreter is on (then they must be on CPU, where the interpreter can read them).
    """
    devices = {t.device.type for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"tensors are on different devices: {sorted(devices)}")
    device = devices.pop()
    if device == "cuda":
        return
    if device == "cpu" and interpreter_enabled():
        return
    raise RuntimeError(
        f"Triton kernel called on {device} tensors; set TRITON_INTERPRET=1 before importing "
        "veil.kernels to run Triton on CPU, or use the torch twin"
    )


def next_pow2(n: int) -> int:
    """tl.arange needs power-of-two lengths: pad every tile dimension up to one."""
    return triton.next_power_of_2(max(int(n), 1))


_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def attention_dot_config(dtype: torch.dtype) -> tuple[tl.dtype, str]:
    """(operand dtype, input_precision) for the tl.dot calls of the attention kernels.

    The dots run in the activations' dtype (K/V are cast to it). fp32 asks for true fp32
    ("ieee"; the default would be TF32 on Ampere+ GPUs). Exception: the Triton 3.x
    interpreter's tl.dot multiplies bf16 operands as their raw uint16 bits, so under the
    interpreter bf16 operands are upcast to fp32; on a GPU bf16 stays on tensor cores.
    """
    if dtype not in _TL_DTYPES:
        raise ValueError(f"unsupported dtype {dtype}")
    dot_dtype = _TL_DTYPES[dtype]
    if dtype == torch.bfloat16 and interpreter_enabled():
        dot_dtype = tl.float32
    return dot_dtype, "ieee" if dot_dtype == tl.float32 else "tf32"


@triton.jit
def load_paged_tile(cache_ptr, block_ids, offsets, kv_head, stride_block, stride_slot, stride_head, d, mask,
                    DOT_DTYPE: tl.constexpr):
    """A [tokens, head_dim] tile of one KV head from a paged cache [blocks, block_size, Hkv, D]:
    token i lives in block `block_ids[i]` at slot `offsets[i]`; masked lanes read 0."""
    return tl.load(
        cache_ptr + block_ids[:, None] * stride_block + offsets[:, None] * stride_slot + kv_head * stride_head
        + d[None, :],
        mask=mask,
        other=0.0,
    ).to(DOT_DTYPE)


@triton.jit
def online_softmax_step(s, m_i, l_i, acc, v, DOT_DTYPE: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """One K/V tile of flash attention's online softmax, shared by the decode and prefill kernels.

    s: the tile's scores [rows, tokens] (masked entries -inf; every row must have seen a finite
    score by now, so the running max is finite); m_i, l_i: running max and sum of exp(score -
    max) per row; acc: running sum of p @ V; v: the tile's values [tokens, head_dim]. Returns
    the updated (m_i, l_i, acc). P is rounded to the dot's input type, as in flash attention
    (exact for fp32).
    """
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=INPUT_PRECISION)
    return m_new, l_i, acc
