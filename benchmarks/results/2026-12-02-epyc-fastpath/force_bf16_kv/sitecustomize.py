# Experiment only (PYTHONPATH=this folder): every Python process, the benchmark's server
# included, treats bf16 as fast on this CPU, so the engine keeps a bf16 KV cache and attends in
# bf16 (the C kernels' vdpbf16ps path) instead of fp32. Not part of veil.
import veil.kernels.ops as _ops

_ops.bf16_is_fast = lambda device="cpu": True
