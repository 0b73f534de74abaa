"""Where the torch ops of one protected layer's server work on the CUDA code path come from,
counted on the CPU: ``../2026-11-28-ntt-launches/layer_count.py`` (its doc says how: the CUDA
dispatch forced on CPU tensors, every Triton launcher a counter around its twin, C kernels off),
with each op it counts also tallied by its Python call site (the innermost frame in the project;
for the modular arithmetic of ``native/modarith.py``, the frame that called it).

    cd benchmarks/results/2026-12-06-cuda-ops && PYTHONSAFEPATH=1 python layer_sites.py
"""

import collections
import os
import sys
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-11-28-ntt-launches"))
import layer_count  # noqa: E402  (first: it turns the C kernels off and patches the launchers before veil runs)

sites: collections.Counter = collections.Counter()  # (message row, op, site)


def tally(func) -> None:
    frames = [f for f in traceback.extract_stack()[:-2]
              if "site-packages" not in f.filename and ("/veil/" in f.filename or "/work/main/" in f.filename)]
    frames = [f for f in frames if "ntt-launches/layer_count.py" not in f.filename]
    f = frames[-1] if frames else None
    if f and "modarith" in f.filename and len(frames) > 1:
        f = next((g for g in reversed(frames) if "modarith" not in g.filename), f)
    where = f"{f.filename.split('/')[-2]}/{f.filename.split('/')[-1]}:{f.lineno} {f.name}" if f else "?"
    sites[(len(layer_count.rows), str(func.overloadpacket), where)] += 1


layer_count.on_op.append(tally)
layer_count.main(sys.argv[1:])

first = len(layer_count.rows) - 3  # the first layer's cycle's three messages are rows first .. first + 2
cycle = collections.Counter()
for (row, op, where), n in sites.items():
    if row >= first:
        cycle[(op, where)] += n
by_site = collections.Counter()
for (_op, where), n in cycle.items():
    by_site[where] += n
print(f"# call sites of the layer's {sum(cycle.values())} torch ops, most first:")
for where, n in by_site.most_common(30):
    top = ", ".join(f"{op.split('.')[-1]} {m}" for (op, w), m in cycle.most_common() if w == where)
    print(f"#   {n:5d}  {where}: {top}")
