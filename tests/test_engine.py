"""Engine units: the paged cache, scheduling, preemption, prefix sharing, and the loop."""

import threading
import time

import httpx
import pytest
import torch

from veil.engine.api import DeviceOutOfMemory, EngineConfig, EngineDead, StepFailed
from veil.engine.engine import Engine
from veil.engine.kv_cache import PagedKVCache
from veil.engine.sampling import SamplingParams
from veil.engine.scheduler import Scheduler, SchedulerConfig
from veil.engine.sequence import Sequence


def _run_requests(engine, prompts, max_new, tenants=None):
    """Submit all at once; wait for all; return the generated tokens of each."""
    outs = [[] for _ in prompts]
    done = threading.Semaphore(0)
    for i, p in enumerate(prompts):
        engine.add_request((tenants or ["t"] * len(prompts))[i], p, max_new, SamplingParams(),
                           on_token=outs[i].append, on_finish=lambda r: done.release())
    for _ in prompts:
        assert done.acquire(timeout=300)
    return outs


@pytest.fixture(scope="module")
def engine(full_model):
    e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=64 << 20, max_tokens_per_step=64)).start()
    yield e
    e.stop()


def test_paged_engine_equals_simple_cache(engine, chat_prompts, local_greedy):
    outs = _run_requests(engine, chat_prompts, 32)
    assert outs == local_greedy


def test_the_engine_loop_sets_its_own_torch_threads(full_model, chat_prompts):
    """EngineConfig.threads is set by the loop thread itself; the caller's thread keeps its count
    (so that the loop's OpenMP team can be the process's only one)."""
    mine = torch.get_num_threads()
    seen = []
    e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=16 << 20, max_tokens_per_step=64, threads=mine + 1),
               on_step=lambda s: seen.append(torch.get_num_threads())).start()
    try:
        _run_requests(e, chat_prompts[:1], 2)
    finally:
        e.stop()
    assert seen and set(seen) == {mine + 1}
    assert torch.get_num_threads() == mine


def test_split_steps_equal_the_simple_cache(engine, split_steps_check):
    split_steps_check(engine)


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_cpu_pool_is_resident_only_where_written():
    """A 384 MiB CPU pool costs almost no RSS until blocks are written, and reads as zeros."""
    before = _rss_bytes()
    cache = PagedKVCache(2, 8192, 16, 3, 64)  # 2 layers x (k, v) x 96 MiB
    pool_bytes = sum(t.numel() * t.element_size() for t in cache.k + cache.v)
    assert pool_bytes == 384 << 20
    block = torch.full((16, 3, 64), 2.0)
    for bid in range(64):  # 64 blocks of 12 KiB in each of the four tensors: 3 MiB written
        for t in cache.k + cache.v:
            t[bid] = block
    grown = _rss_bytes() - before
    assert grown < 32 << 20, grown
    assert torch.equal(cache.k[1][63], block) and not cache.v[0][64:80].any()


def test_token_budget_and_chunked_prefill():
    cache = PagedKVCache(1, 64, 4, 1, 2)
    sched = Scheduler(SchedulerConfig(max_tokens_per_step=10, max_seqs_per_step=8), cache)
    decode = Sequence.tokens("t", [1, 2], 5, SamplingParams())  # arrived first
    long = Sequence.tokens("t", list(range(1, 26)), 5, SamplingParams())
    decode.num_computed = 1  # one input left: a decode-sized step
    cache.grow(decode.table, 1)
    sched.add(decode)
    sched.add(long)
    seen = []
    while long.pending:
        chunks = sched.schedule()
        assert sum(c.length for c in chunks) <= 10
        for c in chunks:
            c.seq.num_computed = c.end
            seen.append((c.seq is long, c.length))
    assert seen[0] == (False, 1)  # the older decode is served first
    assert [n for is_long, n in seen if is_long] == [9, 10, 6]  # 25 prompt tokens in three chunks


def test_decodes_into_held_shared_and_new_blocks():
    """The scheduler's short path (a decode into a private block the sequence holds) allocates
    nothing; a decode into a shared block still copies it, one at a block boundary still grows."""
    cache = PagedKVCache(1, 16, 4, 1, 2)
    sched = Scheduler(SchedulerConfig(max_tokens_per_step=16, max_seqs_per_step=8), cache)
    held = Sequence.tokens("t", list(range(6)), 4, SamplingParams())
    shared = Sequence.tokens("t", list(range(100, 108)), 4, SamplingParams())
    boundary = Sequence.tokens("t", list(range(200, 209)), 4, SamplingParams())
    for seq, computed in ((held, 5), (shared, 7), (boundary, 8)):
        cache.grow(seq.table, computed)
        seq.num_computed = computed
        sched.add(seq)
    cache.register_full_blocks(shared.table, "t", shared.token_ids, 8)
    other = Sequence.tokens("t", list(range(100, 108)), 4, SamplingParams())
    assert cache.allocate_prefix(other.table, "t", other.token_ids) == 8  # shares both blocks
    before = {s.id: list(s.table.blocks) for s in (held, shared, boundary)}
    free = cache.num_free
    chunks = sched.schedule()
    assert [(c.seq, c.start, c.length) for c in chunks] == [(held, 5, 1), (shared, 7, 1), (boundary, 8, 1)]
    assert held.table.blocks == before[held.id]
    assert shared.table.blocks[0] == before[shared.id][0] and shared.table.blocks[1] != before[shared.id][1]
    assert cache.blocks[before[shared.id][1]].ref_count == 1  # the copy released its share
    assert boundary.table.blocks[:2] == before[boundary.id] and len(boundary.table.blocks) == 3
    assert cache.num_free == free - 2


def test_a_split_session_preempted_while_idle_waits_for_its_next_step():
    """An idle split session is the first victim when the pool is full, and it stays out (no
    recompute, no blocks) until its client sends the next step, which then recomputes it first."""
    cache = PagedKVCache(1, 4, 4, 1, 2)
    sched = Scheduler(SchedulerConfig(max_tokens_per_step=32, max_seqs_per_step=8), cache)
    idle = Sequence.hidden("t")  # 8 positions computed, its client between steps
    idle.hidden_rows, idle.num_hidden, idle.num_computed = [torch.zeros(8, 2)], 8, 8
    cache.grow(idle.table, 8)
    sched.add(idle)
    request = Sequence.tokens("t", list(range(1, 13)), 4, SamplingParams())
    sched.add(request)
    first = sched.schedule()
    assert [(c.seq, c.length) for c in first] == [(request, 12)] and not idle.table.blocks
    sched.advance(first)
    assert idle not in [c.seq for c in sched.schedule()]  # still idle: not recomputed
    idle.hidden_rows.append(torch.zeros(1, 2))
    idle.step_start, idle.num_hidden, idle.on_step_done = 8, 9, lambda out: None
    cache.free_table(request.table)
    sched.remove(request)
    assert [(c.seq, c.start, c.length) for c in sched.schedule()] == [(idle, 0, 9)]


def test_preemption_then_resume_gives_the_same_tokens(full_model, chat_prompts, local_greedy):
    # A pool of 8 blocks × 16 tokens cannot hold three sequences of ~40-70 + 32 tokens.
    bytes_per_block = PagedKVCache.bytes_per_token(30, 3, 64, torch.float32) * 16
    e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=8 * bytes_per_block, max_tokens_per_step=64)).start()
    try:
        outs = _run_requests(e, chat_prompts, 32)
        assert e.scheduler.num_preemptions > 0
        assert outs == local_greedy
    finally:
        e.stop()


def test_prefix_sharing_is_per_tenant(full_model, chat_prompts, local_greedy):
    e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=64 << 20)).start()
    try:
        p = chat_prompts[0]
        assert _run_requests(e, [p], 8, ["alice"]) == [local_greedy[0][:8]]
        hits = e.cache.hits
        assert _run_requests(e, [p], 8, ["bob"]) == [local_greedy[0][:8]]
        assert e.cache.hits == hits  # another tenant: no shared block
        assert _run_requests(e, [p], 8, ["alice"]) == [local_greedy[0][:8]]
        assert e.cache.hits - hits == len(p) // 16  # same tenant: every full prompt block reused
    finally:
        e.stop()


def test_tenant_salt_separates_hashes():
    cache = PagedKVCache(1, 16, 4, 1, 2)
    a, b = Sequence.tokens("alice", list(range(8)), 1, SamplingParams()), Sequence.tokens("bob", list(range(8)), 1,
                                                                                           SamplingParams())
    for s in (a, b):
        cache.allocate_prefix(s.table, s.tenant, s.token_ids)
        cache.grow(s.table, 8)
        cache.register_full_blocks(s.table, s.tenant, s.token_ids, 8)
    assert not set(a.table.blocks) & set(b.table.blocks)
    assert not set(a.table.hashes) & set(b.table.hashes)


def test_copy_on_write():
    cache = PagedKVCache(2, 8, 4, 1, 2)
    a = Sequence.tokens("t", list(range(8)), 1, SamplingParams())
    cache.allocate_prefix(a.table, "t", a.token_ids)
    cache.grow(a.table, 8)
    for layer in range(2):
        cache.k[layer][a.table.blocks[1]].fill_(7.0)
    cache.register_full_blocks(a.table, "t", a.token_ids, 8)
    b = Sequence.tokens("t", list(range(8)), 1, SamplingParams())
    assert cache.allocate_prefix(b.table, "t", b.token_ids) == 8
    assert b.table.blocks == a.table.blocks and cache.blocks[a.table.blocks[1]].ref_count == 2
    cache.ensure_writable(b.table, 7, 7)  # b recomputes its last position: must not touch a's block
    assert b.table.blocks[0] == a.table.blocks[0] and b.table.blocks[1] != a.table.blocks[1]
    assert torch.equal(cache.k[1][b.table.blocks[1]], cache.k[1][a.table.blocks[1]])
    assert cache.blocks[a.table.blocks[1]].ref_count == 1 and cache.blocks[b.table.blocks[1]].ref_count == 1


def test_out_of_memory_drops_one_request_and_the_engine_goes_on(full_model, chat_prompts, local_greedy, oom_once):
    """A step whose launch runs out of device memory (here: the first, every prompt's prefill)
    fails one request, the one with the largest chunk; the others are undone, run again and give
    exactly the whole model's tokens; the engine lives on and serves the failed prompt again."""
    e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=64 << 20, max_tokens_per_step=512)).start()
    try:
        failed = oom_once(e.runner, lambda batch: len(batch.lengths) == len(chat_prompts))
        outs, reasons = [[] for _ in chat_prompts], [None] * len(chat_prompts)
        done = threading.Semaphore(0)
        for i, p in enumerate(chat_prompts):
            e.add_request("t", p, 8, SamplingParams(), on_token=outs[i].append,
                          on_finish=lambda r, i=i: (reasons.__setitem__(i, r), done.release()))
        for _ in chat_prompts:
            assert done.acquire(timeout=300)
        assert failed
        longest = max(range(len(chat_prompts)), key=lambda i: (len(chat_prompts[i]), i))
        assert [i for i, r in enumerate(reasons) if isinstance(r, DeviceOutOfMemory)] == [longest]
        assert outs[longest] == []
        assert all(outs[i] == local_greedy[i][:8] for i in range(len(chat_prompts)) if i != longest)
        assert e.alive and e.cache.num_free == e.cache.num_blocks  # every block back in the pool
        assert _run_requests(e, [chat_prompts[longest]], 8) == [local_greedy[longest][:8]]
    finally:
        e.stop()


def test_out_of_memory_copying_the_block_tables_drops_one_request_and_the_rest_run_exactly(
        full_model, chat_prompts, local_greedy, monkeypatch):
    """The device runs out of memory in a step's block-table copy (while preparing it, before
    the launch): one request fails as for a launch, the others run again and give exactly the
    whole model's tokens, and the engine serves the failed prompt afterwards. The failing copy is
    a fake, injected into ``DeviceBlockTables.flush``'s host-to-device copy; the engine is real."""
    import veil.engine.block_tables as bt

    real, failed = bt.to_device, []

    def to_device(x, *a):
        if not failed:  # the first step's copy: every prompt's new blocks
            failed.append(len(x) // 3)
            raise torch.OutOfMemoryError("CUDA out of memory (injected by the test)")
        return real(x, *a)

    monkeypatch.setattr(bt, "to_device", to_device)
    e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=64 << 20, max_tokens_per_step=512))
    outs, reasons = [[] for _ in chat_prompts], [None] * len(chat_prompts)
    done = threading.Semaphore(0)
    for i, p in enumerate(chat_prompts):  # all queued before the loop starts: one first step
        e.add_request("t", p, 8, SamplingParams(), on_token=outs[i].append,
                      on_finish=lambda r, i=i: (reasons.__setitem__(i, r), done.release()))
    e.start()
    try:
        for _ in chat_prompts:
            assert done.acquire(timeout=300)
        assert failed == [sum(e.cache.blocks_for(len(p)) for p in chat_prompts)]
        longest = max(range(len(chat_prompts)), key=lambda i: (len(chat_prompts[i]), i))
        assert [i for i, r in enumerate(reasons) if isinstance(r, DeviceOutOfMemory)] == [longest]
        assert all(outs[i] == local_greedy[i][:8] for i in range(len(chat_prompts)) if i != longest)
        assert e.alive and e.cache.num_free == e.cache.num_blocks
        assert _run_requests(e, [chat_prompts[longest]], 8) == [local_greedy[longest][:8]]
    finally:
        e.stop()


def test_out_of_memory_takes_a_split_step_back(full_model, chat_prompts, oom_once):
    """A split session whose client step runs out of device memory in its second chunk gets the
    error, is left exactly as before that step, and the same step sent again gives what a session
    that never failed gets."""
    e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=64 << 20, max_tokens_per_step=16)).start()
    try:
        with torch.inference_mode():
            rows = full_model.embed(torch.tensor(chat_prompts[2]))  # 40 rows: the first step in 3 chunks
        steps = (rows[:-3], rows[-3:])

        def run(seq, x):
            box, ev = {}, threading.Event()
            e.submit_hidden(seq, x, lambda out: (box.__setitem__("out", out), ev.set()))
            assert ev.wait(120)
            return box["out"]

        a = e.open_hidden("t")
        want = [run(a, x) for x in steps]
        hidden_launches = []
        failed = oom_once(e.runner, lambda batch: batch.hidden is not None
                          and len(hidden_launches.append(1) or hidden_launches) == 2)
        b = e.open_hidden("t")
        error = run(b, steps[0])
        assert failed and isinstance(error, DeviceOutOfMemory)
        assert (b.num_hidden, b.num_computed, b.hidden_rows, b.step_out, b.on_step_done) == (0, 0, [], [], None)
        assert not b.finished
        got = [run(b, x) for x in steps]
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
        e.close(a)
        e.close(b)
    finally:
        e.stop()


@pytest.mark.parametrize("method", ["launch", "finish"])
def test_a_step_that_raises_fails_its_own_work_and_the_engine_goes_on(full_model, chat_prompts, local_greedy,
                                                                      bug_once, method):
    """A step that raises (a bug met by some input; injected into the runner's launch, or into
    its finish, once the step ran) ends the requests in it with StepFailed and takes back a split
    session's client step in it; a split session outside that step, the engine, and the failed
    work sent again are as if nothing had failed. Before, the loop died: 503 for everyone."""
    e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=64 << 20, max_tokens_per_step=256)).start()
    try:
        def run(seq, x):
            box, ev = {}, threading.Event()
            e.submit_hidden(seq, x, lambda out: (box.__setitem__("out", out), ev.set()))
            assert ev.wait(120)
            return box["out"]

        with torch.inference_mode():
            rows = [full_model.embed(torch.tensor(p)) for p in chat_prompts[:2]]
        bystander = e.open_hidden("t")  # holds its KV through the failure, in no failed step
        first = run(bystander, rows[0][:-2])
        failed = bug_once(e.runner, lambda x: True, method)
        reasons, done = [], threading.Semaphore(0)
        e.add_request("t", chat_prompts[2], 8, SamplingParams(), on_finish=lambda r: (reasons.append(r), done.release()))
        assert done.acquire(timeout=120)
        assert failed and isinstance(reasons[0], StepFailed) and e.alive and e.failed_steps == 1
        failed = bug_once(e.runner, lambda x: True, method)
        session = e.open_hidden("t")
        error = run(session, rows[1])
        assert failed and isinstance(error, StepFailed) and not session.finished
        assert (session.num_hidden, session.num_computed, session.hidden_rows, session.on_step_done) == (0, 0, [], None)
        assert e.alive and e.failed_steps == 2
        # the same work again, and the bystander's next step, as if nothing had failed
        assert _run_requests(e, [chat_prompts[2]], 8) == [local_greedy[2][:8]]
        again = run(session, rows[1])
        rest = run(bystander, rows[0][-2:])
        fresh = e.open_hidden("t")
        assert torch.equal(again, run(fresh, rows[1]))
        whole = e.open_hidden("t")  # the bystander's two steps, in a session that saw no failure
        assert torch.equal(first, run(whole, rows[0][:-2])) and torch.equal(rest, run(whole, rows[0][-2:]))
        for s in (bystander, session, fresh, whole):
            e.close(s)
        assert e.cache.num_free == e.cache.num_blocks
    finally:
        e.stop()


def _only_the_second_failed(done, ev, reasons, outs, local_greedy):
    """Three requests of 8 tokens and a split step, queued together: wait for all, then the
    second request failed with StepFailed and the first and third gave their exact tokens."""
    for _ in range(3):
        assert done.acquire(timeout=300)
    assert ev.wait(120)
    assert isinstance(reasons[1], StepFailed) and reasons[0] == reasons[2] == "length"
    assert outs[0] == local_greedy[0][:8] and outs[2] == local_greedy[2][:8]


@pytest.mark.parametrize("overlap", [False, True])  # True: each step launched before the last one's tokens come back
def test_a_bug_one_sequence_meets_in_a_batch_fails_only_that_sequence(full_model, chat_prompts, local_greedy,
                                                                      bug_once, overlap):
    """Every launch of a batch holding one request (the culprit, marked by its top_k) raises:
    the first step, which holds it, two other requests and a split session's step, fails; each
    of them then runs alone, the culprit's own step raises and it alone fails with StepFailed;
    the others give exactly what they give without it, and then batch again."""
    e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=64 << 20, max_tokens_per_step=512))
    with torch.inference_mode():
        rows = full_model.embed(torch.tensor(chat_prompts[2]))
    want_rows = None
    try:
        e.start()
        alone = e.open_hidden("t")
        box, ev = {}, threading.Event()
        e.submit_hidden(alone, rows, lambda out: (box.__setitem__("out", out), ev.set()))
        assert ev.wait(120)
        want_rows = box["out"]
    finally:
        e.stop()
    e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=64 << 20, max_tokens_per_step=512, overlap=overlap))
    culprit = SamplingParams(top_k=7)  # greedy all the same (temperature 0)
    failed = bug_once(e.runner, lambda batch: culprit in batch.sampling[0], times=float("inf"))
    outs, reasons, done = [[] for _ in range(3)], [None] * 3, threading.Semaphore(0)
    for i in range(3):  # all queued before the loop starts: one first step, with the split step
        e.add_request("t", chat_prompts[i], 8, culprit if i == 1 else SamplingParams(), on_token=outs[i].append,
                      on_finish=lambda r, i=i: (reasons.__setitem__(i, r), done.release()))
    session, box, ev = e.open_hidden("t"), {}, threading.Event()
    e.submit_hidden(session, rows, lambda out: (box.__setitem__("out", out), ev.set()))
    e.start()
    try:
        _only_the_second_failed(done, ev, reasons, outs, local_greedy)
        assert torch.equal(box["out"], want_rows)
        assert len(failed) == 2 and e.failed_steps == 2  # the batch, then the culprit alone
        assert e.alive and not e.scheduler.suspects
        assert e.failed_in_a_row == 0 and not e.failing  # the others' steps completed after the culprit's
        e.close(session)
        assert e.cache.num_free == e.cache.num_blocks
    finally:
        e.stop()


def test_a_callback_that_raises_ends_its_own_sequence_and_the_engine_goes_on(full_model, chat_prompts, local_greedy,
                                                                            bug_once):
    """Callbacks run on the loop thread (the server's hop onto its event loop, the engine
    process's pipe, a library user's function). One that raises (a bug, injected here: a
    request's on_token, another's on_finish, a split step's waiter, the step statistics'
    on_step, a failed step's on_finish) ends its own sequence, with StepFailed where its finish
    still hears it; the loop goes on and the work in the same steps comes back exactly.
    Before, the exception stopped the loop."""
    def bug(*args):
        raise RuntimeError("a receiver's bug (injected by the test)")

    stats = []
    e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=64 << 20, max_tokens_per_step=512),
               on_step=lambda s: (stats.append(s), len(stats) == 1 and bug()))
    with torch.inference_mode():
        rows = full_model.embed(torch.tensor(chat_prompts[2]))
    outs, reasons, done = [[] for _ in range(3)], [None] * 3, threading.Semaphore(0)

    def finished(i):
        def on_finish(r):
            reasons[i] = r
            done.release()
            if i == 2:
                bug()
        return on_finish

    for i in range(3):  # all queued before the loop starts: one first step, with the split steps
        e.add_request("t", chat_prompts[i], 8, SamplingParams(), on_token=bug if i == 1 else outs[i].append,
                      on_finish=finished(i))
    broken, bystander, box, ev = e.open_hidden("t"), e.open_hidden("t"), {}, threading.Event()
    e.submit_hidden(broken, rows, bug)
    e.submit_hidden(bystander, rows, lambda out: (box.__setitem__("out", out), ev.set()))
    e.start()
    try:
        _only_the_second_failed(done, ev, reasons, outs, local_greedy)
        assert outs[1] == []
        assert broken.finished and not bystander.finished
        alone, box2, ev2 = e.open_hidden("t"), {}, threading.Event()
        e.submit_hidden(alone, rows, lambda out: (box2.__setitem__("out", out), ev2.set()))
        assert ev2.wait(120) and torch.equal(box["out"], box2["out"])
        failed = bug_once(e.runner, lambda x: True)  # a failed step whose request's on_finish raises
        e.add_request("t", chat_prompts[0], 4, SamplingParams(), on_finish=bug)
        deadline = time.monotonic() + 60
        while not failed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert failed
        assert _run_requests(e, chat_prompts[:1], 4) == [local_greedy[0][:4]]
        assert e.alive and e.failed_steps == 1 and len(stats) > 1
        for s in (bystander, alone):
            e.close(s)
        assert e.cache.num_free == e.cache.num_blocks
    finally:
        e.stop()


def test_a_prompt_outside_the_vocabulary_is_refused_and_the_loop_goes_on(engine, chat_prompts, local_greedy):
    for bad in ([5, engine.model_cfg.vocab_size], [-1, 5]):
        with pytest.raises(ValueError):
            engine.add_request("t", bad, 2, SamplingParams())
    assert engine.alive
    assert _run_requests(engine, chat_prompts[:1], 4) == [local_greedy[0][:4]]


def test_failing_counts_failed_steps_in_a_row_recent_ones_only(full_model, chat_prompts, local_greedy, bug_once):
    """``Engine.failing`` (what /health reads): every launch raising (injected), a request per
    step fails alone; from the 3rd in a row (``failing_after_steps=3``) the engine is failing,
    no longer once the latest is ``failing_for_s`` old, and a completed step ends the run."""
    e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=16 << 20, failing_after_steps=3, failing_for_s=1.0)).start()
    try:
        failed = bug_once(e.runner, lambda batch: True, times=3)
        seen, reasons, done = [], [], threading.Semaphore(0)
        for _ in range(3):  # one after another: each request's step alone
            e.add_request("t", chat_prompts[0], 4, SamplingParams(), on_finish=lambda r: (reasons.append(r), done.release()))
            assert done.acquire(timeout=120) and isinstance(reasons[-1], StepFailed)
            seen.append((e.failed_in_a_row, e.failing))
        assert seen == [(1, False), (2, False), (3, True)] and len(failed) == 3 and e.alive
        time.sleep(1.1)
        assert e.failed_in_a_row == 3 and not e.failing  # no failure for failing_for_s: no longer counted
        assert _run_requests(e, chat_prompts[:1], 4) == [local_greedy[0][:4]]
        assert e.failed_in_a_row == 0 and not e.failing and e.failed_steps == 3
    finally:
        e.stop()


def test_dead_engine_makes_health_503_and_requests_fail_fast(make_server):
    srv = make_server()
    engine = srv.app.state.engine

    def broken(*args):  # fault injection: the loop's own bookkeeping fails (a failing step no longer stops it)
        raise RuntimeError("injected fault")

    engine.scheduler.schedule = broken
    key = srv.keys["alice"]
    r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                   headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 503
    assert httpx.get(f"{srv.url}/health").status_code == 503
    r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                   headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 503
    r = httpx.post(f"{srv.url}/v1/sessions", json={"path": "plaintext"}, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 503


def test_call_runs_on_the_loop_thread_between_steps(full_model, chat_prompts):
    """``Engine.call`` (other components' CPU work, on the loop's OpenMP team): runs on the loop
    thread with the loop's torch threads, returns or raises in the caller, alternates with the
    steps while requests run, and raises EngineDead once the loop has stopped."""
    threads = torch.get_num_threads() + 1
    e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=16 << 20, max_tokens_per_step=64, threads=threads)).start()
    try:
        assert e.call(lambda: (threading.current_thread().name, torch.get_num_threads())) == ("veil-engine", threads)
        with pytest.raises(ZeroDivisionError):
            e.call(lambda: 1 / 0)
        steps_seen, outs = [], {}
        worker = threading.Thread(target=lambda: outs.update(r=_run_requests(e, chat_prompts[:2], 12)))
        worker.start()
        while e.steps == 0 and worker.is_alive():
            time.sleep(0.001)
        for _ in range(5):  # each call waits for a step in between while steps are pending
            steps_seen.append(e.call(lambda: e.steps))
        worker.join(300)
        assert len(outs["r"]) == 2 and all(len(o) == 12 for o in outs["r"])
        assert len(set(steps_seen)) >= 4  # steps ran between the calls: no call starved them
    finally:
        e.stop()
    with pytest.raises(EngineDead):
        e.call(lambda: None)
