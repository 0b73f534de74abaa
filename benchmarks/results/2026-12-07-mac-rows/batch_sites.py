"""Where the torch ops of ``batch_census.py``'s timed step come from (the innermost frame in the
project; for ``native/modarith.py``'s arithmetic, the frame that called it), for the messages of
the first protected layer, which shuffles its FFN per session.

    cd benchmarks/results/2026-12-07-mac-rows && PYTHONSAFEPATH=1 python batch_sites.py
"""

import collections
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import batch_census  # noqa: E402  (first: the counters)
import layer_count  # noqa: E402

sites: collections.Counter = collections.Counter()  # (batched message, site) -> ops


def tally(func) -> None:
    frames = [f for f in traceback.extract_stack()[:-2]
              if "site-packages" not in f.filename and "/results/" not in f.filename]
    f = frames[-1] if frames else None
    if f and "modarith" in f.filename and len(frames) > 1:
        f = next((g for g in reversed(frames) if "modarith" not in g.filename), f)
    where = f"{f.filename.split('/')[-2]}/{f.filename.split('/')[-1]}:{f.lineno} {f.name}" if f else "?"
    sites[(len(batch_census.rows), where)] += 1


layer_count.on_op.append(tally)
batch_census.main()
half = len(batch_census.rows) // 2
for i in range(half, len(batch_census.rows)):
    kind, layer, n, *_ = batch_census.rows[i]
    if layer != batch_census.rows[half][1]:
        continue
    here = collections.Counter({w: c for (row, w), c in sites.items() if row == i})
    print(f"# {kind} layer {layer}: {sum(here.values())} torch ops, by site:")
    for where, c in here.most_common(12):
        print(f"#   {c:6d}  {where}")
