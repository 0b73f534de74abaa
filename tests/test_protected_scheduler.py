"""``StepScheduler``: FCFS, batches of compatible steps bounded in size and wait, one answer each.

The executor here is a fake that records the batches it is handed (a stand-in only for this unit
test of the scheduler: the real batched execution is tested in ``test_native_batch`` and
measured by ``benchmarks/protected_sessions.py``).
"""

import threading
import time
from collections import defaultdict
from types import SimpleNamespace

import pytest

from veil.protected.scheduler import StepScheduler


class FakeExecutor:
    """Messages are (session, key) pairs; key None = may not batch; 'boom' fails its row."""

    def __init__(self, waiting: dict):
        self.be = SimpleNamespace(times=defaultdict(float))
        self.waiting = waiting  # key -> sessions standing at that step
        self.calls: list[list] = []
        self.lock = threading.Lock()

    def batch_key(self, msg):
        return msg[1]

    def sessions_at(self, key):
        return self.waiting.get(key, 1)

    def handle_batch(self, msgs):
        with self.lock:
            self.calls.append(list(msgs))
        self.be.times["matvec"] += 1.0
        time.sleep(0.05)
        return [ValueError(m[0]) if m[0] == "boom" else ("reply", m[0]) for m in msgs]


def _submit_all(sched, msgs, gap=0.0):
    out, threads = {}, []

    def go(m):
        try:
            out[m] = sched.submit(m)
        except ValueError as e:
            out[m] = e

    for m in msgs:
        t = threading.Thread(target=go, args=(m,))
        t.start()
        threads.append(t)
        time.sleep(gap)
    for t in threads:
        t.join(10)
    return out


def test_compatible_steps_batch_and_each_gets_its_own_answer():
    ex = FakeExecutor({"k": 4})
    sched = StepScheduler(ex, max_batch=16, max_wait_s=1.0)
    msgs = [("a", "k"), ("b", "k"), ("boom", "k"), ("d", "k")]
    out = _submit_all(sched, msgs, gap=0.01)
    assert [len(c) for c in ex.calls] == [4]  # all four sessions stood at the step: one batch
    assert out[("a", "k")][0] == ("reply", "a") and out[("a", "k")][2] == 4
    assert out[("a", "k")][1] == {"matvec": pytest.approx(0.25)}  # the batch's seconds, shared
    assert isinstance(out[("boom", "k")], ValueError)


def test_batch_size_is_bounded_and_order_is_fcfs():
    ex = FakeExecutor({"k": 5})
    sched = StepScheduler(ex, max_batch=2, max_wait_s=1.0)
    msgs = [(str(i), "k") for i in range(5)]
    _submit_all(sched, msgs, gap=0.01)
    assert [len(c) for c in ex.calls] == [2, 2, 1]
    assert [m[0] for c in ex.calls for m in c] == [str(i) for i in range(5)]


def test_the_oldest_step_waits_no_longer_than_the_bound():
    ex = FakeExecutor({"k": 8})  # eight sessions could join, only one comes
    sched = StepScheduler(ex, max_batch=16, max_wait_s=0.2)
    t = time.monotonic()
    out = _submit_all(sched, [("a", "k")])
    assert out[("a", "k")][2] == 1
    assert 0.2 <= time.monotonic() - t < 1.5


def test_steps_that_may_not_batch_run_alone_at_once():
    ex = FakeExecutor({"k": 8})
    sched = StepScheduler(ex, max_batch=16, max_wait_s=5.0)
    t = time.monotonic()
    out = _submit_all(sched, [("a", None), ("b", None)], gap=0.01)
    assert time.monotonic() - t < 2.0  # no waiting for mates
    assert sorted(len(c) for c in ex.calls) == [1, 1] and out[("b", None)][2] == 1


def test_batches_run_where_compute_says():
    """``compute`` (the server passes ``Engine.call`` for the native backend on the CPU) runs
    every batch; its exception answers the batch's rows."""
    ex = FakeExecutor({"k": 1})
    ran_on = []

    def compute(fn):
        ran_on.append(threading.current_thread().name)
        if len(ran_on) == 2:
            raise RuntimeError("engine gone")
        return fn()

    sched = StepScheduler(ex, max_batch=4, max_wait_s=0.0, compute=compute)
    assert sched.submit(("a", "k"))[0] == ("reply", "a")
    with pytest.raises(RuntimeError, match="engine gone"):
        sched.submit(("b", "k"))
    assert ran_on == ["veil-he", "veil-he"] and len(ex.calls) == 1
