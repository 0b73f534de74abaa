"""The client's seconds per protected layer as `client_step.py` measures them (that script, run
as it is), with a cProfile of ``ProtectedClientState.handle`` over its six timed steps and the
untimed one (by own time, then cumulative); the profiler's overhead is inside the timed figure.
Run from the repo root:
``PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-client-crt/client_profile.py``."""
import cProfile
import pstats
import runpy
from pathlib import Path

from veil.protected.client import ProtectedClientState

prof, real = cProfile.Profile(), ProtectedClientState.handle


def handle(self, reply):
    prof.enable()
    try:
        return real(self, reply)
    finally:
        prof.disable()


ProtectedClientState.handle = handle  # client_step.py times this wrapper
runpy.run_path(str(Path(__file__).with_name("client_step.py")), run_name="__main__")
stats = pstats.Stats(prof)
stats.sort_stats("tottime").print_stats(25)
stats.sort_stats("cumulative").print_stats(40)
