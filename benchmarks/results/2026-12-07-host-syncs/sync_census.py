"""Host syncs of one protected layer's server work on the CUDA code path, counted on the CPU:
``../2026-12-07-mac-rows/census.py``'s set-up (``protected_bench``, native, layers 10-11,
context 16, the CUDA dispatch forced on CPU tensors, every Triton launcher a counter around its
twin), with every operation that would make the host wait for the GPU tallied by call site:

* torch ops that read a device value on the host: ``_local_scalar_dense`` (``.item()``,
  ``bool(t)``, ``int(t)``), ``nonzero``, ``equal``, ``masked_select``, ``unique``;
* device-to-host copies from the server's Python: ``Tensor.cpu()``, ``.tolist()`` (no-ops on
  CPU tensors, so wrapped in Python here);
* host-to-device copies from pageable memory (a CUDA copy from pageable memory waits for the
  stream's queued work first): ``.to(device)`` of a tensor made from host data, and
  ``torch.tensor``/``as_tensor`` given a device. ``kernels/host.to_device`` (through pinned
  memory on CUDA, queued without a wait) is listed apart, not as a sync.

``encode_many``'s chunk is set to the CUDA one (``ENCODE_CHUNK_GPU``), its checks a read per chunk.

A sync costs more than its own time on a GPU: the host waits until every queued kernel has run,
so the host's dispatch of the next kernels no longer overlaps the device's work.

    cd benchmarks/results/2026-12-07-host-syncs
    PYTHONSAFEPATH=1 python sync_census.py              # one session, one layer (protected_bench)
    PYTHONSAFEPATH=1 python sync_census.py --sessions   # a batched step of two sessions (protected_sessions)
"""

import collections
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "2026-12-07-mac-rows"))
sys.path.insert(0, os.path.join(HERE, "..", "2026-11-28-ntt-launches"))
import census  # noqa: E402,F401  (first: layer_count's set-up, and the rows kernel's stand-ins)
import layer_count  # noqa: E402
import torch  # noqa: E402

SYNC_OPS = {"aten._local_scalar_dense", "aten.nonzero", "aten.equal", "aten.masked_select",
            "aten._unique2", "aten.unique_dim", "aten.unique_consecutive"}
sites: collections.Counter = collections.Counter()  # (message row, what, site)


def where() -> str:
    frames = [f for f in traceback.extract_stack()[:-3]
              if "site-packages" not in f.filename and "/work/main/" in f.filename
              and "/benchmarks/results/" not in f.filename]
    f = frames[-1] if frames else None
    return f"{f.filename.split('/')[-2]}/{f.filename.split('/')[-1]}:{f.lineno} {f.name}" if f else "?"


def tally(what: str) -> None:
    sites[(len(layer_count.rows), what, where())] += 1


def on_op(func) -> None:
    name = str(func.overloadpacket)
    if name in SYNC_OPS:
        tally(name.split(".")[-1])


layer_count.on_op.append(on_op)


def wrap(name, test=lambda self, *a, **kw: True):
    real = getattr(torch.Tensor, name)

    def method(self, *a, **kw):
        if layer_count.state["server"] and not layer_count.state["inside"] and test(self, *a, **kw):
            tally(name)
        return real(self, *a, **kw)

    setattr(torch.Tensor, name, method)


# Host data: on CPU tensors a host-to-device copy is a no-op, so the census marks the tensors
# made from host data (``from_numpy``, ``tensor``/``as_tensor`` without a device) and counts
# their ``.to(...)``; ``tensor``/``as_tensor`` given a device count themselves (on CUDA each is a
# copy from pageable memory, which waits for the stream).
def host_made(fn_name):
    real = getattr(torch, fn_name)

    def fn(*a, **kw):
        if kw.get("device") is not None and layer_count.state["server"] and not layer_count.state["inside"]:
            tally(f"torch.{fn_name}(device=)")
        out = real(*a, **kw)
        if kw.get("device") is None and not (a and torch.is_tensor(a[0])):  # a tensor's stays where it is
            try:
                out._veil_host = True
            except (AttributeError, RuntimeError):
                pass
        return out

    setattr(torch, fn_name, fn)


for _name in ("from_numpy", "tensor", "as_tensor"):
    host_made(_name)
wrap("cpu")
wrap("tolist")
wrap("to", lambda self, *a, **kw: getattr(self, "_veil_host", False) and any(
    isinstance(x, (str, torch.device)) for x in (*a, kw.get("device"))))

# ``kernels/host.to_device`` (a copy queued through pinned memory on CUDA, no wait; on CPU
# tensors it returns its argument) counted where the server's modules call it
def counted_to_device(real):
    def to_device(*a, **kw):
        if layer_count.state["server"] and not layer_count.state["inside"]:
            tally("to_device")
        return real(*a, **kw)
    return to_device


from veil.crypto import ring_switch  # noqa: E402
from veil.crypto.native import backend as native_backend  # noqa: E402
from veil.crypto.native import encoding, evaluator, keys, serial  # noqa: E402
from veil.kernels import host  # noqa: E402

for _module in (ring_switch, encoding, evaluator, keys, serial, host):
    if hasattr(_module, "to_device"):
        _module.to_device = counted_to_device(_module.to_device)
# encode_many's chunk as on CUDA (one read of the device per chunk)
native_backend.ENCODE_CHUNK = getattr(native_backend, "ENCODE_CHUNK_GPU", native_backend.ENCODE_CHUNK)



def batch_step() -> list:
    """``protected_sessions --sessions 2`` (k=28, layers 28-29, context 16, one untimed step
    first): each batched message counted as ``layer_count`` counts one session's. Returns the
    timed step's message kinds (its rows in ``layer_count.rows``)."""
    from veil.benchmarks import protected_sessions
    from veil.protected.server import ProtectedExecutor

    real = ProtectedExecutor._run_batch

    def run_batch(self, msgs):
        layer_count.state["server"] = True
        try:
            with layer_count.TorchOps():
                return real(self, msgs)
        finally:
            layer_count.state["server"] = False
            layer_count.rows.append((f"{msgs[0].kind} layer {msgs[0].layer} x{len(msgs)}",))

    ProtectedExecutor._run_batch = run_batch
    protected_sessions.main(["--sessions", "2", "--warmup", "1", "--out", "bench_out/sync_census.json"])
    return len(layer_count.rows) // 2  # the first half: the warm-up step


if __name__ == "__main__":
    if "--sessions" in sys.argv:
        first = batch_step()
        what = "the batched step (2 sessions, k=28)"
    else:
        layer_count.main(sys.argv[1:])
        first = len(layer_count.rows) - 3  # the first layer's cycle: rows first .. first + 2
        what = "one layer"
    kinds = [str(r[0]) for r in layer_count.rows[first:]]
    by_row = collections.Counter()
    by_site = collections.Counter()
    for (row, what_, at), n in sites.items():
        if row >= first:
            if what_ != "to_device":
                by_row[kinds[row - first]] += n
            by_site[(what_, at)] += n
    pinned = sum(n for (w, _), n in by_site.items() if w == "to_device")
    syncs = sum(by_site.values()) - pinned
    print(f"# {what}'s host syncs: {syncs} (pinned copies, no wait: {pinned}); by message {dict(by_row)}")
    for (what_, at), n in by_site.most_common(40):
        print(f"#   {n:5d}  {what_:26s} {at}")
    print("# by message:")
    for (row, what_, at), n in sorted(sites.items()):
        if row >= first:
            print(f"#   {kinds[row - first]:24s} {n:4d}  {what_:26s} {at}")
