import runpy
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/../2026-11-28-ntt-launches")  # its cuda_dispatch
from cuda_dispatch import force_cuda_dispatch

from veil.crypto.native import ntt, rns
from veil.kernels import ckks_arith, ckks_ops

force_cuda_dispatch(rns, ntt, ckks_ops, ckks_arith)
sys.argv = ["x", sys.argv[1]]
runpy.run_path(__file__.replace("fold_ab_triton.py", "fold_ab.py"), run_name="__main__")
