"""What looking a whole product's graph up costs from Python per call, its name built and hashed
as ``OpGraphs.run`` does: a name of W_gate|up's size (288 diagonals, each (index, address,
shape, strides, level, scale, flags)) and a full key set's (47 keys, each (address, shape,
strides)), as plain tuples (684a12c: rehashed at every call) and as ``graphs.Name`` (hashed
once). Synthetic values of the real shapes; 20,000 calls, two rounds.

    cd benchmarks/results/2026-12-07-product-graphs && PYTHONSAFEPATH=1 python name_hash_us.py
"""

import time

from veil.crypto.native.graphs import Name

plain = (("plan",), 1, *((u, 140_000_000_000 + u * 786_432, (3, 16384), (16384, 1), 2, 2.0**36, True, None)
                         for u in range(288)))
keys = tuple((140_000_000_000 + i * 10**7, (2, 8, 9, 16384), (1179648, 147456, 16384, 1)) for i in range(47))
shapes = (((2, 8, 16384), "torch.int64"),)
named, named_keys = Name(plain), Name(keys)
table = {}
for build in ("tuples", "Name"):
    for rnd in range(2):
        t = time.perf_counter()
        for _ in range(20_000):
            if build == "tuples":
                full = ("product", 7, 2.0**36, plain) + keys + shapes  # 684a12c
            else:
                full = ("product", 7, 2.0**36, named, named_keys) + shapes
            table.get(full)
        print(f"{build}, round {rnd + 1}: {(time.perf_counter() - t) / 20_000 * 1e6:.2f} us per lookup")
