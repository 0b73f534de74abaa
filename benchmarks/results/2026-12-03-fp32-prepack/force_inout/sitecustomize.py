# Experiment only (PYTHONPATH=this folder): every Python process, the benchmark's server
# included, lays fp32 weights out as before this change (a contiguous [in, out] copy, no oneDNN
# prepack), for an A/B in one run. Not part of veil.
import torch

import veil.kernels.linear as _linear

_prepacks = _linear.onednn_prepacks
_linear.onednn_prepacks = lambda dtype: dtype != torch.float32 and _prepacks(dtype)
