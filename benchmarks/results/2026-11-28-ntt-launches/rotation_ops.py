"""The torch ops of one rotation on the CUDA code path (every op, views included), counted as
``launch_count.py`` counts (its setup, then one warm rotation):

    cd benchmarks/results/2026-11-28-ntt-launches && python rotation_ops.py
"""

import collections
import sys

sys.argv = sys.argv[:1]
setup = open("launch_count.py").read().split("cases = {")[0]
exec(compile(setup, "launch_count.py", "exec"))  # noqa: S102 (this folder's own census setup)

seq: list[str] = []


class Seq(TorchDispatchMode):  # noqa: F821 (from the census setup)
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        seq.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


server.rotate(x, 1)  # noqa: F821
with Seq():
    server.rotate(x, 1)  # noqa: F821
print(len(seq), collections.Counter(seq).most_common())
