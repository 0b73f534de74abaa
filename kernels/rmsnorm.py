"""Fused residual-add + RMSNorm (Llama's pre-attention / pre-MLP norm).

Each decoder block does ``residual = x + residual; x = rms_norm(residual)`` twice; fusing the
add into the norm saves one read and one write of the hidden states per norm.

Rounding follows Hugging Face's ``LlamaRMSNorm`` so the engine can match ``transformers``:
the sum is rounded to the input dtype (that rounded value *is* the residual stream), the norm
is computed in fp32 from it, the normalized value is rounded to the input dtype and only then
multiplied by the weight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from veil.kernels._utils import check_triton_device, next_pow2


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    new_residual_ptr,
    stride_x,
    stride_residual,
    stride_out,
    stride_new_residual,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program per row (token): a whole hidden vector fits in one tile (hidden <= ~16k).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        # Round the sum to the storage dtype first: the norm must see exactly the residual
        # that is handed on to the next layer, as in the unfused model.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(new_residual_ptr + row * stride_new_residual + cols, x, mask=mask)
    xf = x.to(tl.float32)
    # Masked columns were loaded as 0, so they do not disturb the sum of squares.
    mean_sq = tl.sum(xf * xf, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(mean_sq + eps)
    normed = (xf * rstd).to(x.dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = normed * w
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """View [..., hidden] as [rows, hidden] with a unit stride along hidden."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton launcher; same contract as :func:`add_rms_norm_torch`."""
    tensors = (x, weight) if residual is None else (x, residual, weight)
    check_triton_device(*tensors)
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(f"weight shape {tuple(weight.shape)} != ({hidden},)")
    x2 = _as_rows(x)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if residual is None:
        r2, new_res = x2, x2  # unused by the kernel (HAS_RESIDUAL=False)
    else:
        if residual.shape != x.shape:
            raise ValueError(f"residual shape {tuple(residual.shape)} != {tuple(x.shape)}")
        r2 = _as_rows(residual.to(x.dtype))
        new_res = torch.empty_like(out)
    n_rows = x2.shape[0]
    if n_rows > 0:
        _add_rms_norm_kernel[(n_rows,)](
            x2,
            r2,
            weight,
            out,
            new_res,
            x2.stride(0),
            r2.stride(0),
            out.stride(0),
            new_res.stride(0),
            hidden,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=next_pow2(hidden),
        )
    if residual is None:
        return out.view(x.shape), x
    return out.view(x.shape), new_res.view(x.shape)


def add_rms_norm_torch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference twin.

    x, residual: [..., hidden] (residual may be None); weight: [hidden].
    Returns (normed, new_residual), both in x's dtype, with new_residual = x + residual
    (or x itself when residual is None).
    """
    if residual is not None:
        x = (x.float() + residual.float()).to(x.dtype)
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    normed = (xf * rstd).to(x.dtype).float() * weight.float()
    return normed.to(x.dtype), x
