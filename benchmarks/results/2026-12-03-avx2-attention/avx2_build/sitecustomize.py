# Experiment only (PYTHONPATH=this folder): every Python process builds the engine's C kernels
# with -mavx2 -mfma instead of -march=native (what an AVX2 CPU without AVX-512 compiles), from
# $VEIL_KERNEL_SOURCE when set (run.sh writes there the source before the AVX2 row kernel).
# Not part of veil.
import functools
import os
from pathlib import Path

import veil.kernels.llama_cpu as _llama_cpu
from veil.kernels import cbuild as _cbuild

if os.environ.get("VEIL_KERNEL_SOURCE"):
    _llama_cpu._SOURCE = Path(os.environ["VEIL_KERNEL_SOURCE"])


@functools.cache
def _avx2_library():
    lib = _cbuild.load(_llama_cpu._SOURCE, (*_llama_cpu._FLAGS, "-mavx2", "-mfma"))
    return None if lib is None else _llama_cpu._declare(lib)


_llama_cpu._library = _avx2_library
