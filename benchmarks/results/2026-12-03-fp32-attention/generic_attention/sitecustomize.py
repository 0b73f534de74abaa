# Experiment only (PYTHONPATH=this folder): every Python process, the benchmark's server
# included, builds the engine's C kernels from $VEIL_OLD_KERNELS (run.sh writes there the
# source before the fp32 row kernel), for an A/B in one run. Not part of veil.
import os
from pathlib import Path

import veil.kernels.llama_cpu as _llama_cpu

_llama_cpu._SOURCE = Path(os.environ["VEIL_OLD_KERNELS"])
