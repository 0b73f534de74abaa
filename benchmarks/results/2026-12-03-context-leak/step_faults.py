"""Where a batched step's page faults fall: ``protected_sessions`` (its arguments, e.g.
``--sessions 1,4 --warmup``) with the process's page faults, system and user seconds around
every ``ProtectedExecutor.handle_batch`` call, printed per message of each timed step.

    python benchmarks/results/2026-12-03-context-leak/step_faults.py --sessions 1,4 --warmup
"""

import resource
import sys
import time

from veil.benchmarks import protected_sessions
from veil.protected import server

handle_batch = server.ProtectedExecutor.handle_batch
log = []


def recording(self, msgs):
    a, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    try:
        return handle_batch(self, msgs)
    finally:
        b = resource.getrusage(resource.RUSAGE_SELF)
        log.append((len(msgs), msgs[0].kind, msgs[0].layer, b.ru_minflt - a.ru_minflt, b.ru_stime - a.ru_stime,
                    b.ru_utime - a.ru_utime, time.perf_counter() - t))


server.ProtectedExecutor.handle_batch = recording
protected_sessions.main(sys.argv[1:])
for n in sorted({r[0] for r in log}):
    rows = [r for r in log if r[0] == n]
    for rows_n, kind, layer, faults, sys_s, user_s, wall in rows[len(rows) // 2:]:  # the timed step (after the warm-up)
        print(f"# timed s{rows_n} {kind}@{layer}: faults {faults}, sys {sys_s:.2f} s, user {user_s:.2f} s, wall {wall:.2f} s")
