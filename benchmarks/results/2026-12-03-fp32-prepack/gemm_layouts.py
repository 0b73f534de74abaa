"""One decode step's fp32 matrices of SmolLM2-135M (30 layers of qkv 960x576, o 576x576,
gate|up 3072x576, down 576x1536, then the 49152x576 head), random weights, 2 torch threads:
the engine's former fp32 layout (a contiguous [in, out] copy) against oneDNN's prepacked
weight (made for 16 rows) at several row counts, with the largest relative difference."""
import time

import torch

torch.set_num_threads(2)
SHAPES, LAYERS = [(960, 576), (576, 576), (3072, 576), (576, 1536)], 30


def per_step_ms(fns, xs, reps=4):
    for f, x in zip(fns, xs):
        f(x)
    t = time.perf_counter()
    for _ in range(reps):
        for f, x in zip(fns, xs):
            f(x)
    return (time.perf_counter() - t) / reps * 1e3


def layouts(ws):
    kn = [w.t().contiguous() for w in ws]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, 16) for w in ws]
    return ([lambda x, k=k: x @ k for k in kn],
            [lambda x, p=p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "") for p in packed])


ws = [torch.randn(o, i) for _ in range(LAYERS) for o, i in SHAPES]
inout, onednn = layouts(ws)
for m in (1, 3, 8, 16, 17, 40, 128, 512):
    xs = [torch.randn(m, w.shape[1]) for w in ws]
    a, b = per_step_ms(inout, xs), per_step_ms(onednn, xs)
    err = max(((p(x) - k(x)).abs().max() / k(x).abs().max()).item() for k, p, x in zip(inout[:4], onednn[:4], xs))
    print(f"layers rows={m}: in-out {a:.2f} ms, onednn {b:.2f} ms, {a / b:.2f}x, rel diff {err:.1e}")
(h_inout,), (h_onednn,) = layouts([torch.randn(49152, 576)])
for m in (1, 16, 64):
    x = [torch.randn(m, 576)]
    a, b = per_step_ms([h_inout], x), per_step_ms([h_onednn], x)
    print(f"head rows={m}: in-out {a:.2f} ms, onednn {b:.2f} ms, {a / b:.2f}x")
