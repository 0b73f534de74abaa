"""Where a protected decode step's time goes on the CPU (native backend, C kernels): cProfile of
one two-layer step at context 16 (layers 10 and 11 of the shipped model, after one untimed
step), then the same step again with every C transform timed by its shape. Run from the repo
root's venv: ``python benchmarks/results/2026-11-29-step-anatomy/step_profile.py``."""
import cProfile
import pstats
from veil.benchmarks import protected_bench as pb
from veil.engine.loader import build_model, load_checkpoint
from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.protected.circuits import relin_key_level, rotation_key_levels
from veil.protected.layouts import dims_of
from veil.protected.server import ProtectedExecutor
from veil.protected.weights import layer_weights_from_tensors
from veil.server.config import ServerConfig
ckpt = load_checkpoint(None); model, cfg = build_model(ckpt), ckpt.config
dims = dims_of(cfg, PROTECTED_PARAMS.slot_count)
c = make_backend(PROTECTED_PARAMS, "native"); c.generate_keys(rotation_key_levels(dims), relin_key_level())
s = make_backend(PROTECTED_PARAMS, "native"); s.import_public_material(c.export_public_material())
layers = (10, 11)
w = [layer_weights_from_tensors(ckpt.tensors, cfg, i, dims) for i in layers]
ex = ProtectedExecutor(s, cfg, w, ServerConfig().protected_limits())
h0, h1, ref = pb._plain_inputs(model, ckpt.tokenizer, 10, 16)
ex.drop_session(pb._timed_step(ex, c, cfg, w, layers, h0, h1, 16)[0].id)
pr = cProfile.Profile(); pr.enable()
out = pb._timed_step(ex, c, cfg, w, layers, h0, h1, 16)
pr.disable()
print("wall", out[5])
st = pstats.Stats(pr); st.sort_stats('tottime').print_stats(30)
import collections
import time

from veil.kernels import ckks_cpu
rec = collections.defaultdict(lambda: [0, 0.0, 0])
orig_r, orig_n = ckks_cpu.ntt_reduced_cpu, ckks_cpu.ntt_cpu
def wrap(name, f):
    def g(primes, x, *a, **k):
        t = time.perf_counter(); out = f(primes, x, *a, **k); dt = time.perf_counter() - t
        r = rec[(name, tuple(x.shape), len(primes))]; r[0] += 1; r[1] += dt; r[2] = out.numel() // out.shape[-1]
        return out
    return g
ckks_cpu.ntt_reduced_cpu = wrap("reduced", orig_r); ckks_cpu.ntt_cpu = wrap("ntt", orig_n)
out = pb._timed_step(ex, c, cfg, w, layers, h0, h1, 16)
tot = 0
for k, (cnt, dt, rows) in sorted(rec.items(), key=lambda kv: -kv[1][1])[:12]:
    print(k, cnt, f"{dt*1e3:.1f} ms", f"{dt/cnt/rows*1e6:.1f} us/row", rows)
    tot += dt
print("total", tot)
