"""Run a benchmark module with its clock reading this process's CPU time instead of wall time:
``python -m veil.benchmarks.cpu_time veil.benchmarks.protected_bench [its arguments]``.

On a machine shared with other jobs, wall seconds of a single-threaded HE computation swing by
±50% with the load; the process's CPU seconds (``time.process_time``) swing by a few percent,
which is what an A/B comparison of two versions of the code needs. Every ``time.perf_counter``
reading of the module (and of what it calls) becomes a CPU-time reading.
"""

from __future__ import annotations

import runpy
import sys
import time


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    time.perf_counter = time.process_time
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
