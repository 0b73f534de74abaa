"""A batch of protected sessions on the CUDA code path, counted on the CPU: ``protected_sessions
--sessions 2`` (k=28, layers 28-29, context 16, two sessions with their own keys, one untimed
step first) with ``layer_count``'s counters (``../2026-11-28-ntt-launches``: every Triton
launcher a counter around its twin, the C kernels off), per batched message: Triton launches by
kernel and torch ops from the server's Python. The first protected layer shuffles its FFN per
session, so its W_gate|up and W_down products read per-row plaintexts; before this commit those
took the twin on a GPU (the Triton ``mac`` reads one ``[L, N]`` weight per term).

    cd benchmarks/results/2026-12-07-mac-rows
    PYTHONSAFEPATH=1 python batch_census.py [--before]
"""

import os
import sys

sys.argv = [a for a in sys.argv if a != "--before"] + (["--before"] if "--before" in sys.argv else [])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import census  # noqa: E402  (the counters, mac_many_triton's, and --before's dispatch; runs nothing here)
import layer_count  # noqa: E402

from veil.benchmarks import protected_sessions  # noqa: E402
from veil.protected.server import ProtectedExecutor  # noqa: E402

_run_batch = ProtectedExecutor._run_batch
rows = []


def run_batch(self, msgs):
    layer_count.launches.clear()
    layer_count.ops.clear()
    layer_count.state["server"] = True
    census.stacked.update(bytes=0, calls=0)
    try:
        with layer_count.TorchOps():
            return _run_batch(self, msgs)
    finally:
        layer_count.state["server"] = False
        rows.append((str(msgs[0].kind), msgs[0].layer, len(msgs), dict(layer_count.launches),
                     sum(layer_count.launches.values()), sum(layer_count.ops.values()), census.stacked["bytes"]))


ProtectedExecutor._run_batch = run_batch


def main() -> None:
    protected_sessions.main(["--sessions", "2", "--warmup", "1", "--out", "bench_out/batch_census.json"])
    step = rows[len(rows) // 2:]  # the timed step (the first half: the warm-up step)
    for kind, layer, n, by_kernel, total, n_ops, stacked in step:
        print(f"# {kind} layer {layer} ({n} sessions): {total} Triton launches {by_kernel}; {n_ops} torch ops; "
              f"torch.stack {stacked / 1e6:.1f} MB")
    print(f"# the step: {sum(r[4] for r in step)} Triton launches, {sum(r[5] for r in step)} torch ops, "
          f"torch.stack {sum(r[6] for r in step) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
