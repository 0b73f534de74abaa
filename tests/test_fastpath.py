"""The fast path's step machinery: device block tables kept in sync incrementally, seeded
sampling through the engine whatever the batch, the client/server thread split, and (on CUDA
only) CUDA-graph replay against eager steps."""

import os
import threading

import pytest
import torch

from veil.client.sdk import client_threads
from veil.engine.api import EngineConfig
from veil.engine.batch import decode_meta
from veil.engine.block_tables import DeviceBlockTables
from veil.engine.engine import Engine
from veil.engine.kv_cache import PagedKVCache
from veil.engine.sampling import SamplingParams
from veil.engine.sequence import Sequence


def test_device_block_tables_follow_grow_copy_on_write_and_free():
    cache = PagedKVCache(1, 16, 4, 1, 2)
    tables = DeviceBlockTables(8, torch.device("cpu"), rows=1)
    a = Sequence.tokens("t", list(range(8)), 1, SamplingParams())
    cache.allocate_prefix(a.table, "t", a.token_ids)
    cache.grow(a.table, 8)
    row = tables.sync(a.id, a.table)
    assert tables.buf[row, :2].tolist() == a.table.blocks and a.table.synced == 2
    cache.register_full_blocks(a.table, "t", a.token_ids, 8)
    b = Sequence.tokens("t", list(range(8)), 1, SamplingParams())
    cache.allocate_prefix(b.table, "t", b.token_ids)
    assert tables.sync(b.id, b.table) != row  # a second row (the buffer grew)
    cache.ensure_writable(b.table, 7, 7)  # copy-on-write replaces b's second block
    assert b.table.synced == 1
    tables.sync(b.id, b.table)
    assert tables.buf[tables.row_of[b.id], :2].tolist() == b.table.blocks
    cache.grow(b.table, 12)  # one appended block (index 2): only it is written
    before = tables.buf.clone()
    tables.sync(b.id, b.table)
    changed = (tables.buf != before).nonzero().tolist()
    assert changed == [[tables.row_of[b.id], 2]] and tables.buf[tables.row_of[b.id], 2] == b.table.blocks[2]
    cache.free_table(a.table)
    assert a.table.synced == 0
    tables.release(a.id)
    c = Sequence.tokens("t", [1], 1, SamplingParams())
    assert tables.row(c.id) == row  # the released row is reused


def test_device_block_tables_write_a_steps_entries_in_one_flush(monkeypatch):
    import veil.engine.block_tables as bt

    copies = []
    monkeypatch.setattr(bt, "to_device", lambda x, *a: copies.append(x) or torch.tensor(x, dtype=torch.long))
    cache = PagedKVCache(1, 16, 4, 1, 2)
    tables = DeviceBlockTables(8, torch.device("cpu"), rows=4)
    seqs = [Sequence.tokens("t", [1] * n, 1, SamplingParams()) for n in (3, 9)]
    for s in seqs:
        cache.grow(s.table, len(s.token_ids))
    rows = [tables.stage(s.id, s.table) for s in seqs]
    assert not tables.buf.any() and not copies  # staged only
    tables.flush()
    assert len(copies) == 1
    for s, r in zip(seqs, rows, strict=True):
        assert tables.buf[r, :len(s.table.blocks)].tolist() == s.table.blocks and s.table.synced == len(s.table.blocks)
    tables.flush()
    assert len(copies) == 1  # nothing staged: no copy


def test_device_block_tables_discard_what_a_failed_flush_left_staged(monkeypatch):
    """A flush whose copy runs out of device memory writes nothing; ``discard`` then counts the
    staged entries as not on the device, so the next step stages them again, and nothing staged
    for a row that was released meanwhile is written later (the failing copy is a fake)."""
    import veil.engine.block_tables as bt

    copies, calls = [], []

    def to_device(x, *a):
        calls.append(1)
        if len(calls) == 1:  # the first copy fails
            raise torch.OutOfMemoryError("CUDA out of memory (injected by the test)")
        copies.append(list(x))
        return torch.tensor(x, dtype=torch.long)

    monkeypatch.setattr(bt, "to_device", to_device)
    cache = PagedKVCache(1, 16, 4, 1, 2)
    tables = DeviceBlockTables(8, torch.device("cpu"), rows=4)
    a, b = (Sequence.tokens("t", [1] * n, 1, SamplingParams()) for n in (5, 9))
    for s in (a, b):
        cache.grow(s.table, len(s.token_ids))
        tables.stage(s.id, s.table)
    with pytest.raises(torch.OutOfMemoryError):
        tables.flush()
    tables.discard()
    assert not tables.buf.any() and (a.table.synced, b.table.synced) == (0, 0)
    cache.free_table(a.table)  # a ends; c takes its row
    tables.release(a.id)
    c = Sequence.tokens("t", [1] * 3, 1, SamplingParams())
    cache.grow(c.table, 3)
    rows = [tables.stage(s.id, s.table) for s in (c, b)]
    tables.flush()
    assert len(copies) == 1 and len(copies[0]) == 3 * (len(c.table.blocks) + len(b.table.blocks))
    for s, r in zip((c, b), rows, strict=True):
        assert tables.buf[r, :len(s.table.blocks)].tolist() == s.table.blocks
    assert not tables.buf[rows[0], len(c.table.blocks):].any()  # none of a's old entries


def _collect(engine, requests):
    outs = [[] for _ in requests]
    done = threading.Semaphore(0)
    for out, (prompt, n, params) in zip(outs, requests, strict=True):
        engine.add_request("t", prompt, n, params, on_token=out.append, on_finish=lambda r: done.release())
    for _ in requests:
        assert done.acquire(timeout=300)
    return outs


def test_seeded_request_is_reproducible_whatever_the_batch(full_model, chat_prompts):
    e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=64 << 20, max_tokens_per_step=64)).start()
    try:
        p = SamplingParams(temperature=0.8, top_p=0.95, top_k=50, seed=1234)
        alone = _collect(e, [(chat_prompts[0], 12, p)])[0]
        crowd = _collect(e, [(chat_prompts[1], 20, SamplingParams(temperature=1.0)), (chat_prompts[0], 12, p),
                             (chat_prompts[2], 5, SamplingParams())])
        assert crowd[1] == alone
        other = _collect(e, [(chat_prompts[0], 12, SamplingParams(temperature=0.8, top_p=0.95, top_k=50, seed=99))])
        assert other[0] != alone
    finally:
        e.stop()


@pytest.mark.parametrize("fast", [False, True])
def test_cpu_kv_cache_is_bf16_only_where_bf16_is_fast(full_model, monkeypatch, fast):
    """bf16 weights get a bf16 KV cache (and bf16 attention) where bf16 is fast (CUDA, AMX-BF16
    CPUs), an fp32 one elsewhere; fp32 weights always an fp32 one. `bf16_is_fast` is forced
    both ways here (a stand-in for the CPU flag, in this test only), and a bf16 engine with
    either cache generates."""
    import copy

    from veil.kernels import ops

    monkeypatch.setattr(ops, "bf16_is_fast", lambda device="cpu": fast)
    cfg = EngineConfig(kv_cache_bytes=16 << 20, max_tokens_per_step=64)
    assert Engine(full_model, 2, cfg).cache.k[0].dtype == torch.float32
    e = Engine(copy.deepcopy(full_model).to(torch.bfloat16), 2, cfg).start()
    try:
        assert e.cache.k[0].dtype == (torch.bfloat16 if fast else torch.float32)
        [out] = _collect(e, [([1, 2, 3, 4, 5], 4, SamplingParams())])
        assert len(out) == 4
    finally:
        e.stop()


def test_bf16_is_fast_on_amx_or_on_avx512_bf16_under_the_c_kernels():
    """AMX-BF16 is fast for torch's own attention too; AVX512-BF16 only for the C kernels'
    (their vdpbf16ps path): with the twins (``VEIL_CPU_KERNELS=0``, no compiler) bf16 attention
    there was several times slower than fp32. Neither flag: fp32."""
    from veil.kernels.ops import bf16_is_fast_on_cpu

    amx, avx512 = "fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile".split(), "fpu avx2 avx512f avx512_bf16".split()
    assert bf16_is_fast_on_cpu(amx, True) and bf16_is_fast_on_cpu(amx, False)
    assert bf16_is_fast_on_cpu(avx512, True) and not bf16_is_fast_on_cpu(avx512, False)
    assert not bf16_is_fast_on_cpu("fpu avx2 fma".split(), True)
    assert not bf16_is_fast_on_cpu(["avx512_bf16x"], True)  # whole flags, not substrings


def test_client_threads_leave_a_core_to_a_loopback_server(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert client_threads("http://127.0.0.1:8443") == 1
    assert client_threads("https://localhost:1") == 1
    assert client_threads("http://[::1]:80") == 1
    assert client_threads("https://veil.example.com") is None
    assert client_threads("http://127.0.0.1:8443", threads=2) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                    reason="the Triton interpreter copies to the host, which a graph capture refuses: "
                           "run with TRITON_INTERPRET=0 on a CUDA machine")
def test_cuda_graph_replay_equals_eager(full_model, chat_prompts):
    """Decode steps replayed from CUDA graphs give the eager steps' logits and tokens."""
    cfg = dict(kv_cache_bytes=256 << 20, max_tokens_per_step=512, max_seqs_per_step=8, device="cuda")
    graphs = Engine(full_model, 2, EngineConfig(**cfg))
    eager = Engine(full_model, 2, EngineConfig(**cfg, cuda_graphs=False))
    assert graphs.runner.graphs is not None and eager.runner.graphs is None
    reqs = [(p, 24, SamplingParams()) for p in chat_prompts]
    out = []
    for e in (graphs, eager):
        e.start()
        try:
            out.append(_collect(e, reqs))
        finally:
            e.stop()
    assert out[0] == out[1]
    # logits of one graph replay against the eager forward on the same inputs (batch 3, bucket 4)
    runner = graphs.runner
    seqs = [Sequence.tokens("t", p, 4, SamplingParams()) for p in chat_prompts]
    for s in seqs:
        graphs.scheduler.add(s)
    chunks = graphs.scheduler.schedule()
    runner.run(runner.prepare(chunks))
    for c in chunks:
        c.seq.num_computed = c.end
        c.seq.token_ids.append(1)
    chunks = graphs.scheduler.schedule()
    assert all(c.length == 1 for c in chunks)
    batch = runner.prepare(chunks)
    info = batch.seq_info.cuda()
    ids = batch.token_ids.cuda()
    g = runner.graphs
    with torch.inference_mode():
        replayed = g.run(ids, info).clone()
        n, b = ids.shape[0], g.outputs[next(x for x in g.buckets if x >= ids.shape[0])].shape[0]
        # the graph's own padded inputs, run eagerly: the same kernels on the same shapes
        same = runner.forward_logits(g.ids[:b], decode_meta(g.positions[:b], g.slots[:b], g.tables[:b],
                                                                    g.ctx[:b]))[:n]
    torch.testing.assert_close(replayed, same, atol=1e-4, rtol=1e-4)


def test_serve_refuses_cuda_without_a_device(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    from veil.cli.main import main

    tenants = tmp_path / "t.json"
    assert main(["tenants", "add", "a", "--scope", "plaintext", "--file", str(tenants)]) == 0
    assert main(["serve", "--tenants", str(tenants), "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
