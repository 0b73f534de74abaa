"""Which backend operation or timed section of the timed 4-session step takes the page faults:
``protected_sessions --sessions 1,4 --warmup`` with the process's faults counted around every
``TimedBackend`` call and section and every message of the timed s4 step (the fourth step:
after 6 + 6 + 6 messages), most first. A diagnosis aid, run once at a4f490c.

    python benchmarks/results/2026-12-03-context-leak/fault_sites.py --sessions 1,4 --warmup
"""

import collections
import contextlib
import resource
import sys

from veil.benchmarks import protected_sessions
from veil.protected import server, timing

faults: collections.Counter = collections.Counter()
state = {"on": False, "messages": 0}


def minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


backend_attr = timing.TimedBackend.__getattr__


def counted_attr(self, name):
    attr = backend_attr(self, name)
    if not callable(attr):
        return attr

    def call(*a, **kw):
        f0 = minflt()
        try:
            return attr(*a, **kw)
        finally:
            if state["on"]:
                faults["op " + name] += minflt() - f0

    return call


section = timing.TimedBackend.section


@contextlib.contextmanager
def counted_section(self, kind, detail=None):
    f0 = minflt()
    with section(self, kind, detail):
        yield
    if state["on"]:
        faults[f"section {kind} {detail or ''}"] += minflt() - f0


handle_batch = server.ProtectedExecutor.handle_batch


def counted_batch(self, msgs):
    state["messages"] += 1
    state["on"] = len(msgs) == 4 and state["messages"] > 18
    f0 = minflt()
    try:
        return handle_batch(self, msgs)
    finally:
        if state["on"]:
            faults[f"message {msgs[0].kind}"] += minflt() - f0


timing.TimedBackend.__getattr__ = counted_attr
timing.TimedBackend.section = counted_section
server.ProtectedExecutor.handle_batch = counted_batch
protected_sessions.main(sys.argv[1:])
for site, n in faults.most_common(25):
    print(f"# {n:8d} {site}")
