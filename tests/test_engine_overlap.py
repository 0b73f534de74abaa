"""The engine loop with overlapped steps (``EngineConfig.overlap``): the next step is scheduled and
launched before the previous one's tokens are back, its decodes reading their input ids on the
device. On the CPU nothing runs ahead (a launch computes), but the bookkeeping is the same as on
a GPU: these tests force it on and check that every result equals the synchronous loop's."""

import threading

import pytest
import torch

from veil.engine.api import DeviceOutOfMemory, EngineConfig
from veil.engine.engine import Engine
from veil.engine.kv_cache import PagedKVCache
from veil.engine.sampling import SamplingParams
from veil.engine.sequence import PENDING


def _run(engine, prompts, max_new, sampling=None, stop_ids=(), tenants=None):
    """Submit all at once; wait for all; each request's tokens and finish reason."""
    outs, reasons = [[] for _ in prompts], [None] * len(prompts)
    done = threading.Semaphore(0)
    seqs = []
    for i, p in enumerate(prompts):
        def fin(r, i=i):
            reasons[i] = r
            done.release()
        seqs.append(engine.add_request((tenants or ["t"] * len(prompts))[i], p, max_new, sampling or SamplingParams(),
                                       stop_ids=stop_ids, on_token=outs[i].append, on_finish=fin))
    for _ in prompts:
        assert done.acquire(timeout=300)
    return outs, reasons, seqs


def _engine(model, overlap, **kw):
    cfg = dict(kv_cache_bytes=64 << 20, max_tokens_per_step=64) | kw
    return Engine(model, 2, EngineConfig(**cfg, overlap=overlap)).start()


@pytest.fixture(scope="module")
def overlapped(full_model):
    e = _engine(full_model, True)
    assert e.overlap
    yield e
    e.stop()


def test_overlap_is_off_on_the_cpu_by_default(full_model):
    e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=16 << 20))
    assert not e.overlap  # a launch computes there: nothing to overlap


def test_greedy_tokens_equal_the_simple_cache(overlapped, chat_prompts, local_greedy):
    """Chunked prefills beside decodes (a 64-token budget), every decode's input read from the
    step before on the device."""
    outs, reasons, seqs = _run(overlapped, chat_prompts, 32)
    assert outs == local_greedy
    assert reasons == ["length"] * len(chat_prompts)
    assert all(PENDING not in s.token_ids and s.num_output_tokens == 32 for s in seqs)


def test_seeded_sampling_equals_the_synchronous_loop(overlapped, full_model, chat_prompts):
    """A seeded request draws the same tokens: the counter of each draw is the index of the token
    drawn, pending tokens counted."""
    sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
    sync = _engine(full_model, False)
    try:
        want = _run(sync, chat_prompts, 16, sampling)[0]
    finally:
        sync.stop()
    assert _run(overlapped, chat_prompts, 16, sampling)[0] == want


def test_stop_token_ends_the_request_and_drops_the_step_run_ahead(overlapped, chat_prompts, local_greedy):
    """The loop has already scheduled (and on a GPU run) one more decode when it learns of a stop
    token: that step's token is never delivered, the pending id leaves the sequence, and the
    other requests go on unchanged."""
    stop = local_greedy[0][5]
    first = local_greedy[0].index(stop)
    outs, reasons, seqs = _run(overlapped, chat_prompts[:2], 32, stop_ids=(stop,))
    assert outs[0] == local_greedy[0][:first + 1] and reasons[0] == "stop"
    assert PENDING not in seqs[0].token_ids
    other = local_greedy[1]  # the same stop applies to it: up to its own first stop, if any
    want = (other[:other.index(stop) + 1], "stop") if stop in other else (other, "length")
    assert (outs[1], reasons[1]) == want


def test_out_of_memory_with_a_step_in_flight(full_model, chat_prompts, local_greedy, oom_once):
    """A decode step that runs out of device memory while the step before it is in flight (its
    decodes reading that step's tokens on the device): it is undone without touching the step in
    flight, whose tokens still arrive; the newest of the equal chunks is dropped, keeping the
    tokens it had; the others finish with exactly the whole model's tokens."""
    e = _engine(full_model, True)
    try:
        failed = oom_once(e.runner, lambda b: len(b.lengths) == 3 and b.pending_rows and e.steps >= 8)
        outs, reasons, seqs = _run(e, chat_prompts, 32)
    finally:
        e.stop()
    assert failed and len(failed[0].pending_rows) == 3  # all three decodes read the step in flight
    assert isinstance(reasons[2], DeviceOutOfMemory) and reasons[:2] == ["length", "length"]
    assert outs[:2] == local_greedy[:2]
    assert 0 < len(outs[2]) < 32 and outs[2] == local_greedy[2][:len(outs[2])]
    assert all(PENDING not in s.token_ids for s in seqs)


def test_preemption_with_steps_in_flight_gives_the_same_tokens(full_model, chat_prompts, local_greedy):
    """A pool too small for every sequence: sequences are preempted while their previous step is
    still in flight, and a recompute may read a token that step is sampling."""
    bytes_per_block = PagedKVCache.bytes_per_token(30, 3, 64, torch.float32) * 16
    e = _engine(full_model, True, kv_cache_bytes=8 * bytes_per_block)
    try:
        outs = _run(e, chat_prompts, 32)[0]
        assert e.scheduler.num_preemptions > 0
        assert outs == local_greedy
    finally:
        e.stop()


def test_prefix_blocks_are_registered_from_resolved_tokens(full_model, chat_prompts, local_greedy):
    """Blocks are published for sharing only once their tokens are known: a repeat of a prompt
    reuses every full prompt block and gives the same tokens."""
    e = _engine(full_model, True, max_tokens_per_step=512)
    try:
        p = chat_prompts[0]
        assert _run(e, [p], 8)[0] == [local_greedy[0][:8]]
        hits = e.cache.hits
        assert _run(e, [p], 8)[0] == [local_greedy[0][:8]]
        assert e.cache.hits - hits == len(p) // 16
    finally:
        e.stop()


def test_abort_while_a_step_is_in_flight(overlapped, chat_prompts, local_greedy):
    """An abort from another thread between two steps: no further token, no crash, and the
    request beside it finishes as it would alone."""
    got, done = [], threading.Event()
    seq = None

    def on_token(t):
        got.append(t)
        if len(got) == 3:
            threading.Thread(target=lambda: overlapped.abort(seq)).start()

    seq = overlapped.add_request("t", chat_prompts[0], 32, SamplingParams(), on_token=on_token,
                                 on_finish=lambda r: done.set())
    other = _run(overlapped, chat_prompts[1:2], 32)[0]
    assert done.wait(60)
    assert got == local_greedy[0][:len(got)] and len(got) < 32
    assert other == local_greedy[1:2]
    assert PENDING not in seq.token_ids


def test_calls_run_between_overlapped_steps(overlapped, chat_prompts):
    """``Engine.call`` completes the step in flight first, then runs, while requests go on."""
    outs = {}
    worker = threading.Thread(target=lambda: outs.update(r=_run(overlapped, chat_prompts[:2], 12)[0]))
    worker.start()
    seen = [overlapped.call(lambda: overlapped.steps) for _ in range(5)]
    worker.join(300)
    assert all(len(o) == 12 for o in outs["r"])
    assert seen == sorted(seen)


def test_split_steps_equal_the_simple_cache(overlapped, split_steps_check):
    """A split session's hidden steps through the overlapped loop (their outputs copied back when
    the step completes, after the next one is launched): test_engine's check on this engine."""
    split_steps_check(overlapped)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_overlap_equals_the_synchronous_loop(full_model, chat_prompts):
    """On a GPU the overlap is real (the sampled ids copied to pinned memory behind an event
    while the next step is queued): the same greedy tokens as finishing every step first."""
    outs = []
    for overlap in (False, True):
        e = Engine(full_model, 2, EngineConfig(kv_cache_bytes=256 << 20, max_tokens_per_step=64, device="cuda",
                                               cuda_graphs=False, overlap=overlap)).start()
        try:
            assert e.overlap is overlap
            outs.append(_run(e, chat_prompts, 24)[0])
        finally:
            e.stop()
    assert outs[0] == outs[1]
