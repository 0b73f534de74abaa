"""Torch ops from the server's Python in a batched k=28 step on the CUDA code path, counted on
the CPU, by call site, at N sessions: ``protected_sessions --sessions N --warmup 1`` with
``../2026-12-07-mac-rows/census.py``'s set-up (the CUDA dispatch forced on CPU tensors, every
Triton launcher a counter around its twin, C kernels off); the timed step's ops (its six batched
messages) by the innermost frame in the project. Two runs (N = 2 and 4) give what each further
session adds, and where.

    cd benchmarks/results/2026-12-07-host-syncs
    PYTHONSAFEPATH=1 python batch_growth.py 2 && PYTHONSAFEPATH=1 python batch_growth.py 4
    python batch_growth.py --compare 2 4
"""

import collections
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))


def compare(a: int, b: int) -> None:
    x, y = (json.load(open(os.path.join(HERE, f"bench_out/growth_sites{n}.json"))) for n in (a, b))
    d = {k: y.get(k, 0) - x.get(k, 0) for k in set(x) | set(y)}
    print(f"# torch ops: {sum(x.values())} at {a} sessions, {sum(y.values())} at {b}; "
          f"{sum(d.values()) / (b - a):.0f} per further session")
    for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:15]:
        print(f"#   {v / (b - a):7.0f} per session  {k}")


def count(n: int) -> None:
    sys.path.insert(0, os.path.join(HERE, "..", "2026-12-07-mac-rows"))
    sys.path.insert(0, os.path.join(HERE, "..", "2026-11-28-ntt-launches"))
    import census  # noqa: F401  (first: layer_count's set-up, and the rows kernel's stand-ins)
    import layer_count

    from veil.benchmarks import protected_sessions
    from veil.protected.server import ProtectedExecutor

    sites = collections.Counter()

    def where() -> str:
        frames = [f for f in traceback.extract_stack()[:-3] if "/site-packages/" not in f.filename
                  and "/benchmarks/results/" not in f.filename and "/modarith" not in f.filename]
        f = frames[-1] if frames else None
        return f"{f.filename.split('/')[-2]}/{f.filename.split('/')[-1]}:{f.lineno} {f.name}" if f else "?"

    layer_count.on_op.append(lambda func: sites.update([where()]) if layer_count.state.get("timed") else None)
    real, calls = ProtectedExecutor._run_batch, []

    def run_batch(self, msgs):
        calls.append(1)
        layer_count.state["server"] = True
        layer_count.state["timed"] = len(calls) > 6  # the second step (the first: the warm-up)
        try:
            with layer_count.TorchOps():
                return real(self, msgs)
        finally:
            layer_count.state["server"] = False

    ProtectedExecutor._run_batch = run_batch
    protected_sessions.main(["--sessions", str(n), "--warmup", "1", "--out", f"bench_out/growth{n}.json"])
    with open(os.path.join(HERE, f"bench_out/growth_sites{n}.json"), "w") as f:
        json.dump(dict(sites), f)
    print(f"# the timed step at {n} sessions: {sum(sites.values())} torch ops")


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(int(sys.argv[2]), int(sys.argv[3]))
    else:
        count(int(sys.argv[1]))
