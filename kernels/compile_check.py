"""Compile every kernel for a CUDA GPU without one: a CPU-only smoke test of the GPU path.

The interpreter (TRITON_INTERPRET=1) runs kernels as Python/NumPy, so it cannot catch what only
the real compiler rejects (tl.dot shape or dtype rules, unsupported control flow, type
mismatches in loops). This module drives the real launchers with small CPU tensors, intercepts
each kernel launch to record its arguments, and compiles the kernel ahead of time for a CUDA
target (Triton's bundled ptxas; no driver, no GPU). It never launches anything.

    TRITON_INTERPRET=0 python -m veil.kernels.compile_check [--arch 90]

Exit status 0 when every kernel compiled, 1 otherwise.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from veil.kernels import (
    _utils,
    activation,
    kv_store,
    paged_attention,
    prefill_attention,
    rmsnorm,
    rope,
)

_PTR_TYPES = {
    torch.float32: "*fp32",
    torch.float16: "*fp16",
    torch.bfloat16: "*bf16",
    torch.int32: "*i32",
    torch.int64: "*i64",
}


def _arg_type(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return _PTR_TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot type kernel argument {value!r}")


def _record_launches(calls: Callable[[], None]) -> list[tuple[JITFunction, dict[str, Any]]]:
    """Run the launchers in `calls`, returning (kernel, bound arguments) per launch."""
    launches: list[tuple[JITFunction, dict[str, Any]]] = []

    def fake_run(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        bound = dict(zip(self.arg_names, args, strict=False))
        bound.update(kwargs)
        launches.append((self, bound))

    real_run = JITFunction.run
    modules = (activation, kv_store, paged_attention, prefill_attention, rmsnorm, rope)
    real_checks = {m: m.check_triton_device for m in modules}
    JITFunction.run = fake_run  # type: ignore[method-assign]
    for m in modules:
        m.check_triton_device = lambda *tensors: None  # CPU tensors stand in for CUDA ones
    try:
        calls()
    finally:
        JITFunction.run = real_run  # type: ignore[method-assign]
        for m, check in real_checks.items():
            m.check_triton_device = check
    return launches


def _launch_all(dtype: torch.dtype) -> None:
    """One call of every launcher, at the default model's sizes (SmolLM2: 9/3 heads of 64)."""
    t, hidden, hq, hkv, d, inter, bs = 4, 576, 9, 3, 64, 1536, 16
    x = torch.zeros(t, hidden, dtype=dtype)
    rmsnorm.add_rms_norm_triton(x, x, torch.ones(hidden, dtype=dtype), 1e-5)
    rmsnorm.add_rms_norm_triton(x, None, torch.ones(hidden, dtype=dtype), 1e-5)
    q, k = torch.zeros(t, hq, d, dtype=dtype), torch.zeros(t, hkv, d, dtype=dtype)
    cos, sin = rope.build_rope_cache(d, 128, 100000.0)
    rope.apply_rope_triton(q, k, torch.zeros(t, dtype=torch.int64), cos, sin)
    activation.silu_and_mul_triton(torch.zeros(t, 2 * inter, dtype=dtype))
    cache = torch.zeros(8, bs, hkv, d, dtype=dtype)
    kv_store.store_kv_triton(k, k, cache, cache, torch.zeros(t, dtype=torch.int64))
    tables = torch.zeros(2, 4, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    paged_attention.paged_decode_attention_triton(q[:2], cache, cache, tables, lens, 0.125)
    cu = torch.tensor([0, 1, t], dtype=torch.int32)
    prefill_attention.paged_prefill_attention_triton(
        q, cache, cache, tables, cu, lens, 0.125, max_seqlen_q=3
    )


def compile_all(arch: int = 90, dtypes: tuple[torch.dtype, ...] = (torch.float16,)) -> list[str]:
    """Compile every kernel launch for `sm_<arch>`; returns one error line per failure."""
    if _utils.interpreter_enabled():
        raise RuntimeError("run with TRITON_INTERPRET=0: the interpreter cannot compile")
    target = GPUTarget("cuda", arch, 32)
    failures = []
    for dtype in dtypes:
        for kernel, bound in _record_launches(lambda dt=dtype: _launch_all(dt)):
            constexprs = {p.name: bound[p.name] for p in kernel.params if p.is_constexpr}
            signature = {
                name: "constexpr" if name in constexprs else _arg_type(bound[name])
                for name in kernel.arg_names
            }
            label = f"{kernel.fn.__name__} [{dtype}]"
            try:
                triton.compile(ASTSource(kernel, signature, constexprs), target=target)
                print(f"ok   {label}")
            except Exception as exc:  # report every kernel, not just the first failure
                lines = [line for line in str(exc).splitlines() if line.strip()]
                summary = " | ".join(lines[:1] + lines[-1:]) if lines else ""
                failures.append(f"{label}: {type(exc).__name__}: {summary}")
                print(f"FAIL {failures[-1]}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=inspect.cleandoc(__doc__ or "").split("\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 80")
    parser.add_argument(
        "--dtypes", default="float32,float16,bfloat16", help="comma-separated torch dtypes"
    )
    args = parser.parse_args(argv)
    dtypes = tuple(getattr(torch, name) for name in args.dtypes.split(","))
    return 1 if compile_all(args.arch, dtypes) else 0


if __name__ == "__main__":
    sys.exit(main())
