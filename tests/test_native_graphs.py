"""CUDA graphs of the native backend's key switches (``veil.crypto.native.graphs``).

On a CUDA device: a backend that replays graphs gives the bytes of one that launches eagerly, at
every call (the eager first, the capture, the replays), for single sessions and batches of
sessions whose rows' keys differ, and after the address-table cache dropped the tables a graph
reads. Everywhere: what names a graph, the address tables kept for a capture, and the
first-eager / then-capture / then-replay bookkeeping (with a stand-in for the capture, below).
"""

import contextlib

import numpy as np
import pytest
import torch

from veil.crypto.backend import make_backend
from veil.crypto.linear import encode_matrix, matvec, plan_matvec, replicate_input
from veil.crypto.native import graphs as G
from veil.crypto.native import keys as K
from veil.crypto.params import PROTECTED_PARAMS
from veil.kernels import ckks_ops

P = PROTECTED_PARAMS
SLOTS = P.slot_count
PRODUCT = plan_matvec(64, 64, SLOTS, "bsgs", 8)
STEPS = sorted({1, -3, 100} | set(PRODUCT.rotation_steps))
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# ---- everywhere ---------------------------------------------------------------------------------
def test_a_key_is_named_by_its_storage_and_a_batch_by_every_row():
    a, b = torch.zeros(2, 3, 4, 8, dtype=torch.int64), torch.zeros(2, 3, 4, 8, dtype=torch.int64)
    ka, kb = K.SwitchKey(a, b""), K.SwitchKey(b, b"")
    assert G.key_storage(ka) == ((a.data_ptr(), (2, 3, 4, 8), a.stride()),)
    assert G.key_storage(ka) != G.key_storage(kb)
    rows = K.RowKeys((ka, kb))
    assert G.key_storage(rows) == G.key_storage(ka) + G.key_storage(kb)
    assert G.key_storage(K.RowKeys((kb, ka))) != G.key_storage(rows)


def test_keep_tables_holds_the_tables_launches_read_while_open():
    keys = [torch.zeros(4, dtype=torch.int64), torch.ones(4, dtype=torch.int64)]
    outer, inner = [], []
    with ckks_ops.keep_tables(outer):
        first = ckks_ops._addresses(keys, "cpu")
        with ckks_ops.keep_tables(inner):
            second = ckks_ops._addresses(keys[:1], "cpu")
    ckks_ops._addresses(keys, "cpu")  # closed: kept by no one
    assert [t is first for t in outer] == [True, False] and outer[1] is second
    assert len(inner) == 1 and inner[0] is second
    assert first.tolist() == [k.data_ptr() for k in keys]


def test_graphs_are_kept_on_cuda_only_and_only_when_asked(monkeypatch):
    assert make_backend(P, "native", cuda_graphs=True)._graphs is None  # no CUDA graph of CPU work
    monkeypatch.setenv("VEIL_NATIVE_CUDA_GRAPHS", "1")
    assert make_backend(P, "native")._graphs is None
    if torch.cuda.is_available():
        assert isinstance(make_backend(P, "native", device="cuda")._graphs, G.OpGraphs)
        assert not make_backend(P, "native", device="cuda")._graphs.products
        monkeypatch.setenv("VEIL_NATIVE_CUDA_GRAPHS", "products")
        assert make_backend(P, "native", device="cuda")._graphs.products
        monkeypatch.delenv("VEIL_NATIVE_CUDA_GRAPHS")
        assert make_backend(P, "native", device="cuda")._graphs is None
        assert isinstance(make_backend(P, "native", device="cuda", cuda_graphs=True)._graphs, G.OpGraphs)


def test_static_buffers_are_shared_by_role_and_shape_within_a_byte_budget():
    graphs = G.OpGraphs(torch.device("cpu"), max_buffer_bytes=3 * 8 * 16)
    x, y = torch.zeros(16, dtype=torch.int64), torch.ones(16, dtype=torch.int64)
    a = graphs._buffer("in0", x)
    assert graphs._buffer("in0", y) is a and graphs._buffer("in1", x) is not a  # a role per operand
    assert graphs._buffer("out", x) is not None and graphs.buffer_bytes == 3 * 8 * 16
    assert graphs._buffer("out", torch.zeros(2, dtype=torch.int64)) is None  # over the budget: eager
    assert graphs._buffer("in0", x) is a


def test_the_device_budget_counts_what_graphs_may_hold(cpu_pair):
    _, eager, routed = cpu_pair[0]
    assert routed._graphs.reserved_bytes == 2 * G.MAX_BUFFER_BYTES
    assert _StandIn(products=True).reserved_bytes == 2 * G.MAX_BUFFER_BYTES + G.PRODUCT_POOL_BYTES
    assert routed.resident_bytes() == eager.resident_bytes() + routed._graphs.reserved_bytes


class _StandIn(G.OpGraphs):
    """Only for this test of ``OpGraphs.run``'s bookkeeping (no CUDA here): "capturing" keeps the
    function and "replaying" calls it on the static copies of the inputs, or the capture fails
    for names listed in ``failing``."""

    def __init__(self, failing=(), max_graphs=G.MAX_GRAPHS, products=False):
        super().__init__(torch.device("cpu"), max_graphs, products=products)
        self.failing, self.calls = set(failing), []

    def _capture(self, full, fn, inputs):
        if full[0] in self.failing:
            return G._EAGER
        self.captures += 1
        static = tuple(x.clone() for x in inputs)
        return G._Graph(fn, static, torch.empty(0), [], G._split(fn(*static))[1])  # the facts, as a capture finds them

    def _replay(self, g, inputs):
        self.replays += 1
        for buf, x in zip(g.inputs, inputs, strict=True):
            buf.copy_(x)
        out = G._split(g.graph(*g.inputs))[0]
        return out if g.facts is None else (out, g.facts)


def test_a_name_runs_eagerly_once_then_is_captured_and_replayed():
    graphs = _StandIn(failing={"sync"})
    seen = []

    def double(x):
        seen.append(x)
        return 2 * x

    x4, x5 = torch.arange(4), torch.arange(5)
    for i in range(4):
        assert torch.equal(graphs.run(("op", 1), double, x4 + i), 2 * (x4 + i))
    assert (graphs.captures, graphs.replays) == (1, 3)  # call 1 eager; 2 captured and replayed; 3, 4
    assert torch.equal(graphs.run(("op", 1), double, x5), 2 * x5)  # other shapes: another name
    assert (graphs.captures, graphs.replays) == (1, 3)
    assert torch.equal(graphs.run(("op", 2), double, x4), 2 * x4)  # other static arguments too
    assert (graphs.captures, graphs.replays) == (1, 3)
    for _ in range(3):  # a failed capture leaves the name eager, on the caller's inputs
        assert torch.equal(graphs.run(("sync",), double, x4), 2 * x4)
    assert (graphs.captures, graphs.replays) == (1, 3) and seen[-1] is x4


def test_the_least_recently_used_graphs_go_first():
    graphs = _StandIn(max_graphs=2)
    x = torch.arange(3)
    for name in ("a", "b", "a", "b", "a", "c", "c"):  # a, b captured; a used again; c evicts b
        graphs.run((name,), torch.neg, x)
    assert list(graphs._graphs) == [("a", ((3,), torch.int64)), ("c", ((3,), torch.int64))]
    assert graphs.captures == 3


def _sessions(device: str, graphs):
    """Two clients' material, each on an eager server and on one whose key switches go through
    ``graphs(device)``."""
    out = []
    for _ in range(2):
        client = make_backend(P, "native")
        client.generate_keys(STEPS)
        material = client.export_public_material()
        eager, graphed = make_backend(P, "native", device=device), make_backend(P, "native", device=device)
        for s in (eager, graphed):
            s.import_public_material(material)
        graphed._graphs = graphs(device)
        out.append((client, eager, graphed))
    return out


@pytest.fixture(scope="module")
def cpu_pair():
    return _sessions("cpu", lambda device: _StandIn())


@pytest.mark.parametrize("op", ["rotate", "rotate_many", "multiply", "multiply_unrelinearized", "rescale"])
def test_the_evaluator_sends_its_key_switches_through_the_graphs(cpu_pair, op):
    """On the CPU, with the stand-in: each operation's calls go through ``OpGraphs.run`` (its
    closures bound to the right key, level and inputs), and what the replays compute from the
    static copies is the eager backend's bytes."""
    client, eager, routed = cpu_pair[0]
    rng = np.random.default_rng(14)
    replays = routed._graphs.replays
    for _ in range(3):
        ups = [client.encrypt_to_bytes(rng.standard_normal(SLOTS) * 0.5) for _ in range(2)]
        want = eager.serialize(_ops(eager, *(eager.deserialize(u) for u in ups))[op]())
        assert routed.serialize(_ops(routed, *(routed.deserialize(u) for u in ups))[op]()) == want
    assert routed._graphs.replays > replays


def test_a_graphed_calls_own_calls_run_inside_its_capture():
    """A graphed call's calls of further graphed operations run directly inside its capture
    (and its stand-in replays): never a replay inside a capture, nor the lock taken twice.
    Where it runs eagerly (its first call, a failed capture) they are graphed as any others."""
    graphs = _StandIn(failing={"eager"})
    x = torch.arange(4)

    def outer(y):
        return graphs.run(("inner",), torch.neg, y) + 1

    for _ in range(4):  # eager (inner seen), captured, replayed, replayed: inner never captured
        assert torch.equal(graphs.run(("outer",), outer, x), 1 - x)
    assert [n[0] for n in graphs._graphs] == ["outer"] and [n[0] for n in graphs._seen] == ["outer", "inner"]
    for _ in range(2):  # an outer whose capture fails: eager, and inner captured then replayed
        assert torch.equal(graphs.run(("eager",), outer, x), 1 - x)
    assert [n[0] for n in graphs._graphs] == ["outer", "eager", "inner"] and graphs.captures == 2  # LRU order


class _FakeCudaGraph:
    """For the next test only: torch.cuda's graph, on the CPU, capturing and replaying nothing
    (so a "replay" leaves the output buffer as the capture wrote it)."""

    def capture_begin(self, pool=None, capture_error_mode="global"):
        pass

    def capture_end(self):
        pass

    def pool(self):
        return None

    def replay(self):
        pass


class _FakeStream:
    def __init__(self, device=None):
        pass

    def wait_stream(self, other):
        pass


def test_a_graph_returns_the_facts_its_capture_found(monkeypatch):
    """``OpGraphs._capture`` and ``_replay`` as written (torch.cuda's graph and streams replaced
    by fakes that capture nothing): a function's facts come back from the capture at every
    replay, not from the replay's inputs, which are copied into the static buffer."""
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeCudaGraph)
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    graphs = G.OpGraphs(torch.device("cpu"))
    x = torch.arange(4)
    got = [graphs.run(("f",), lambda y: (2 * y, ("sum", int(y.sum()))), x + i) for i in range(3)]
    assert [(t.tolist(), facts) for t, facts in got[:2]] == [([0, 2, 4, 6], ("sum", 6)), ([2, 4, 6, 8], ("sum", 10))]
    assert got[2][1] == ("sum", 10) and graphs.replays == 2  # the capture's facts, not 14
    (static,) = next(iter(graphs._graphs.values())).inputs
    assert static.tolist() == (x + 2).tolist()


def _whole_products_give_the_eager_bytes(sessions, batch_rows=None):
    """Products of two matrices, each three times on new inputs (eager, captured, replayed):
    the eager backend's bytes, level and scale every time; then the products of a batch of the
    two sessions, whose graphs are named by both rows' keys."""
    (c0, e0, g0), (c1, e1, g1) = sessions
    rng = np.random.default_rng(15)
    mats = [(encode_matrix(e0, w, P.top_level, n1=8), encode_matrix(g0, w, P.top_level, n1=8))
            for w in (rng.standard_normal((64, 64)) / 8, rng.standard_normal((64, 64)) / 8)]
    before = g0._graphs.replays
    for me, mg in mats:
        for _ in range(3):
            up = c0.encrypt_to_bytes(replicate_input(rng.standard_normal(64), SLOTS))
            want, got = matvec(e0, me, e0.deserialize(up)), matvec(g0, mg, g0.deserialize(up))
            assert g0.serialize(got) == e0.serialize(want)
            assert (g0.level(got), g0.scale(got)) == (e0.level(want), e0.scale(want))
    assert g0._graphs.replays >= before + 2
    names = [n for n in g0._graphs._graphs if n[0] == "product"]
    assert len(names) == 2  # one per matrix
    for _ in range(3):
        for order in ((0, 1), (0, 0)):  # on g0's graphs, the same shapes and plaintexts, other keys
            sessions_in = [sessions[i] for i in order]
            ups = [c.encrypt_to_bytes(replicate_input(rng.standard_normal(64), SLOTS)) for c, _, _ in sessions_in]
            batch = sessions_in[0][2].batched([g for _, _, g in sessions_in])
            rows = batch.unstack(matvec(batch, mats[0][1], batch.stack([g.deserialize(up) for (_, _, g), up
                                                                         in zip(sessions_in, ups, strict=True)])))
            for (_, e, g), up, row in zip(sessions_in, ups, rows, strict=True):
                assert g.serialize(row) == e.serialize(matvec(e, mats[0][0], e.deserialize(up)))
    # each batch's product named by both rows' keys (a span of g0's positions reads g0's own)
    assert len([n for n in g0._graphs._graphs if n[0] == "product"]) == 4


def test_whole_products_go_through_one_graph_each(cpu_pair):
    """With the stand-in and products on: each matrix's product is one graphed call (its own
    rotations inside it), named by its plaintexts and the keys, giving the eager bytes, level
    and scale; a batch's products are named by every row's keys."""
    for _, _, g in cpu_pair:
        g._graphs = _StandIn(products=True)
    try:
        _whole_products_give_the_eager_bytes(cpu_pair)
        client, _, g = cpu_pair[0]
        m = encode_matrix(g, np.eye(64) / 2, P.top_level, n1=8)
        up = client.encrypt_to_bytes(replicate_input(np.ones(64), SLOTS))
        counts = []
        for _ in range(3):  # eager (its rotations and rescales graphed one by one), captured, replayed
            before = g._graphs.replays
            matvec(g, m, g.deserialize(up))
            counts.append(g._graphs.replays - before)
        assert counts[0] > 1 and counts[1:] == [1, 1]  # then one replay for the whole product
    finally:
        for _, _, g in cpu_pair:
            g._graphs = _StandIn()


def _products(be) -> list:
    return [n for n in (*be._graphs._seen, *be._graphs._graphs) if n[0] == "product"]


def test_a_product_whose_plaintexts_are_unchecked_is_not_graphed(cpu_pair):
    """A matrix whose all-zero flags are not known yet (the first product computes them) is
    not named: its product runs directly, and is graphed from the next one."""
    client, _, routed = cpu_pair[0]
    routed._graphs = _StandIn(products=True)
    try:
        m = encode_matrix(routed, np.eye(64) / 2, P.top_level, n1=8)
        for pt in m.plaintexts.values():
            pt.nonzero = None
        up = client.encrypt_to_bytes(replicate_input(np.ones(64), SLOTS))
        matvec(routed, m, routed.deserialize(up))  # its rotations and rescales graphed one by one
        assert not _products(routed) and all(pt.nonzero for pt in m.plaintexts.values())
        matvec(routed, m, routed.deserialize(up))
        assert len(_products(routed)) == 1
    finally:
        routed._graphs = _StandIn()


# ---- on a CUDA device ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair():
    return _sessions("cuda", G.OpGraphs)


def _ops(s, a, b):
    return {
        "rotate": lambda: s.add(s.rotate(a, 100), s.rotate(a, 1)),  # two graphs of one shape
        "rotate_low": lambda: s.rotate(s.mod_switch_to(a, 3), -3),
        "rotate_many": lambda: s.add(*s.rotate_many(a, [1, -3])),
        "multiply": lambda: s.multiply(a, b),  # the product, relinearization and rescale
        "multiply_unrelinearized": lambda: s.relinearize(s.multiply(a, b, rescale=False, relinearize=False)),
        "rescale": lambda: s.rescale(s.multiply_plain(a, s.encode(np.ones(8), s.level(a)), rescale=False)),
    }


@cuda
@pytest.mark.parametrize("op", ["rotate", "rotate_low", "rotate_many", "multiply", "multiply_unrelinearized",
                                "rescale"])
def test_graph_replays_give_the_eager_bytes(pair, op):
    client, eager, graphed = pair[0]
    rng = np.random.default_rng(11)
    before = (graphed._graphs.captures, graphed._graphs.replays)
    results = []
    for _ in range(4):  # eager, captured, replayed, replayed: each on new inputs
        ups = [client.encrypt_to_bytes(rng.standard_normal(SLOTS) * 0.5) for _ in range(2)]
        want = eager.serialize(_ops(eager, *(eager.deserialize(u) for u in ups))[op]())
        got = _ops(graphed, *(graphed.deserialize(u) for u in ups))[op]()
        results.append((got, want))
    for got, want in results:  # an earlier result is not overwritten by a later replay
        assert graphed.serialize(got) == want
    # calls 3 and 4 at least replay (a name another op captured first replays from call 1)
    assert graphed._graphs.captures > 0 and graphed._graphs.replays >= before[1] + 2


def _batches_replay_their_own_graphs(pair):
    (c0, e0, g0), (c1, e1, g1) = pair
    rng = np.random.default_rng(12)
    enc = encode_matrix(e0, rng.standard_normal((64, 64)) / 8, P.top_level, n1=8)

    def fn(s, ct):
        return s.rotate(matvec(s, enc, ct), 100)

    for _ in range(3):
        for second_client, second_eager, second_graphed in ((c0, e0, g0), (c1, e1, g1)):
            ups = [c.encrypt_to_bytes(replicate_input(rng.standard_normal(64), SLOTS)) for c in (c0, second_client)]
            batch = g0.batched([g0, second_graphed])
            rows = batch.unstack(fn(batch, batch.stack([g0.deserialize(ups[0]), second_graphed.deserialize(ups[1])])))
            for s, e, up, row in zip((g0, second_graphed), (e0, second_eager), ups, rows, strict=True):
                assert s.serialize(row) == e.serialize(fn(e, e.deserialize(up)))
    assert g0._graphs.replays > 0


def test_batches_name_their_graphs_by_every_rows_keys(cpu_pair):
    """With the stand-in: a batch whose first row is the same session uses that session's
    graphs; a batch with another second session (other keys) gets graphs of its own."""
    _batches_replay_their_own_graphs(cpu_pair)


@cuda
def test_batches_with_other_rows_keys_replay_their_own_graphs(pair):
    """Batches whose first row is the same session share that session's graphs; the rows' keys
    name them, so a batch with another second session gets its own graph and its own bytes."""
    _batches_replay_their_own_graphs(pair)


@cuda
def test_whole_product_replays_give_the_eager_bytes():
    """On the device: products of two matrices, each eager, captured and replayed as one graph,
    and a batch's, give the eager backend's bytes, level and scale."""
    _whole_products_give_the_eager_bytes(_sessions("cuda", lambda device: G.OpGraphs(device, products=True)))


@cuda
def test_a_graph_reads_its_address_tables_after_the_cache_dropped_them(pair):
    client, eager, graphed = pair[0]
    rng = np.random.default_rng(13)
    ups = [client.encrypt_to_bytes(rng.standard_normal(SLOTS)) for _ in range(4)]
    for up in ups[:2]:  # eager, then captured
        graphed.rotate(graphed.deserialize(up), 1)
    ckks_ops._address_table.cache_clear()
    filler = [torch.full((1 << 16,), 7, dtype=torch.int64, device="cuda") for _ in range(64)]  # reuse freed memory
    replays = graphed._graphs.replays
    for up in ups[2:]:
        assert graphed.serialize(graphed.rotate(graphed.deserialize(up), 1)) == \
            eager.serialize(eager.rotate(eager.deserialize(up), 1))
    assert graphed._graphs.replays == replays + 2 and filler


@cuda
def test_an_address_table_made_while_capturing_leaves_the_name_eager():
    """A table of addresses the cache lacks when a capture reaches it (copied from pinned host
    memory, which a replay would read again after its reuse) fails that capture: the name runs
    eagerly, with the right result."""
    graphs, fresh = G.OpGraphs(torch.device("cuda")), iter(range(1 << 30))

    def fn(x):
        table = ckks_ops._address_table((next(fresh), x.data_ptr()), "cuda")  # a miss at every call
        return x + table[1:] * 0 + 1

    x = torch.arange(8, device="cuda")
    for _ in range(3):
        assert torch.equal(graphs.run(("f",), fn, x), x + 1)
    assert graphs.captures == 0 and graphs.replays == 0


@cuda
def test_out_of_memory_while_capturing_fails_the_call_and_the_next_call_captures():
    """An out-of-memory error during a capture reaches the caller (the server's 503) without
    leaving the name eager; a later call captures it."""
    graphs, oom = G.OpGraphs(torch.device("cuda")), {"on": True}

    def fn(x):
        if oom["on"] and torch.cuda.is_current_stream_capturing():
            raise torch.OutOfMemoryError("stand-in for a full device, in this test")
        return x + 1

    x = torch.arange(8, device="cuda")
    assert torch.equal(graphs.run(("f",), fn, x), x + 1)  # eager
    with pytest.raises(torch.OutOfMemoryError):
        graphs.run(("f",), fn, x)
    oom["on"] = False
    assert torch.equal(graphs.run(("f",), fn, x), x + 1) and graphs.captures == 1
    assert torch.equal(graphs.run(("f",), fn, x + 5), x + 6) and graphs.replays == 2


@cuda
def test_an_operation_that_syncs_stays_eager_and_the_device_goes_on(pair):
    """A capture that fails (a host sync inside it) leaves that name eager, gives the eager
    result, and leaves the device usable for the graphs that do capture. Last in the module: a
    failed capture is the one thing here that could leave CUDA unusable."""
    graphs = G.OpGraphs(torch.device("cuda"))

    def syncs(x):
        y = x * 2
        return y if int(y.sum().item()) >= 0 else -y

    x = torch.arange(8, device="cuda")
    for _ in range(3):
        assert torch.equal(graphs.run(("syncs",), syncs, x), 2 * x)
    assert graphs.captures == 0 and list(graphs._graphs.values()) == [G._EAGER]
    client, eager, graphed = pair[0]
    up = client.encrypt_to_bytes(np.ones(SLOTS))
    for _ in range(3):
        assert graphed.serialize(graphed.rotate(graphed.deserialize(up), -3)) == \
            eager.serialize(eager.rotate(eager.deserialize(up), -3))
