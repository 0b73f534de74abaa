"""Registers and spills of the ct x pt kernels for sm_90a, from Triton's bundled ptxas (no GPU):
``_mac_rows_kernel`` (every giant step of a product in one launch) at the tiles its launcher
picks for 1, 2 and 16 sessions, against ``_mac_kernel`` (one giant step per launch).

    PYTHONSAFEPATH=1 TRITON_INTERPRET=0 python ptxas_regs.py
    MAX_RB=4 ...   # taller tiles, as tried before settling on 2
"""
import os
import re
import subprocess
import tempfile

import torch
import triton
import triton.backends.nvidia.compiler
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from veil.crypto.native.modarith import Basis
from veil.crypto.params import PROTECTED_PARAMS
from veil.kernels import ckks_ops

launches = []
JITFunction.run = lambda self, *a, grid, warmup, **kw: launches.append((self, {**dict(zip(self.arg_names, a, strict=False)), **kw}, grid))
ckks_ops.check_triton_device = lambda *t: None
ckks_ops._MAX_RB = int(os.environ.get("MAX_RB", ckks_ops._MAX_RB))
basis, n = Basis.of(PROTECTED_PARAMS.primes[:-1]), 16384  # level 7's data basis: q_0 .. q_7
w = torch.zeros(8, n, dtype=torch.int64)
for sessions in (1, 2, 16):
    a = torch.zeros(16, sessions, 2, 8, n, dtype=torch.int64)
    ckks_ops.mac_many_triton(a, [[w] * 16] * 18, basis)  # W_gate|up's shape: 18 giant steps of 16 baby steps
ckks_ops.mac_triton(torch.zeros(16, 2, 8, n, dtype=torch.int64), torch.zeros(16, 8, n, dtype=torch.int64), basis)
ptxas = triton.backends.nvidia.compiler.get_ptxas(90).path  # the one Triton compiles with (CUDA 13.4)
types = {torch.int64: "*i64", torch.int32: "*i32", torch.float64: "*fp64"}
for kernel, bound, grid in launches:
    cx = {p.name: bound[p.name] for p in kernel.params if p.is_constexpr}
    sig = {k: "constexpr" if k in cx else types[bound[k].dtype] if isinstance(bound[k], torch.Tensor) else "i64"
           for k in kernel.arg_names}
    ptx = triton.compile(ASTSource(kernel, sig, cx), target=GPUTarget("cuda", 90, 32),
                         options={"enable_fp_fusion": False, "num_warps": 4}).asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        out = subprocess.run([str(ptxas), "-v", "--gpu-name", "sm_90a", f.name, "-o", "/dev/null"],
                             capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", out).group(1)
    spill = re.search(r"(\d+) bytes spill stores", out).group(1)
    tile = {k: v for k, v in cx.items() if k in ("RB", "BLOCK")}
    print(f"{kernel.fn.__name__} {tile} grid {grid}: {regs} registers, {spill} bytes spill stores")
