"""`make test`: the suite as one pytest process per module, two at a time.

    python tests/run_suite.py [-j JOBS] [tests/test_x.py ...]

Why one process per module: SEAL's memory pool never returns memory to the OS and module
fixtures hold real models, keys and servers, so a single process grows with every module it has
run (a pytest-xdist worker that ran half the suite was OOM-killed at 13 GB on the 24 GB
machine); a process per module peaks at that module's own need. A module's ``he_heavy`` tests
(real CKKS keys and encoded layers at N=16384) run in a process of their own besides.

Why two at a time: SEAL holds the GIL and one core while it computes, so a single stream
leaves the second core idle for most of the protected tests. Two rules keep the machine
within its memory and timing: at most one ``he_heavy`` unit runs at a time (their peaks, up to
11.5 GB measured, must not add up), and a ``solo`` unit (a Ray cluster, whose proxy must come
up within Ray's fixed 60 s) runs with nothing beside it. Heavy units start first (they are
the longest), solo ones last.

Each unit's output is printed when it ends; a table of units, results, seconds and peak RSS
(of the unit's largest process) closes the run. Exit status 1 if any unit failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OK = (0, 5)  # pytest: passed, or nothing selected


@dataclass
class Unit:
    module: str
    marks: str  # the -m expression
    kind: str  # "heavy" | "solo" | "normal"
    rc: int | None = None
    seconds: float = 0.0
    peak_gb: float = 0.0
    log: Path | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"{self.module} [{self.marks}]"


class _Markers:
    """A pytest plugin that records, per module, whether it has he_heavy, other and solo tests."""

    def __init__(self) -> None:
        self.modules: dict[str, dict[str, bool]] = {}

    def pytest_collection_finish(self, session) -> None:
        for item in session.items:
            m = self.modules.setdefault(item.nodeid.split("::")[0], {"heavy": False, "other": False, "solo": False})
            m["heavy" if item.get_closest_marker("he_heavy") else "other"] = True
            m["solo"] |= item.get_closest_marker("solo") is not None


def collect(paths: list[str]) -> list[Unit]:
    """The units, from a collection in a subprocess (it imports every test module: its memory
    should not stay in this long-lived process)."""
    out = subprocess.run([sys.executable, __file__, "--collect", *paths], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"collection failed:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    modules = json.loads(out.stdout.strip().splitlines()[-1])
    units = []
    for mod, m in sorted(modules.items()):
        if m["heavy"]:
            units.append(Unit(mod, "he_heavy", "solo" if m["solo"] else "heavy"))
        if m["other"]:
            units.append(Unit(mod, "not he_heavy", "solo" if m["solo"] else "normal"))
    order = {"heavy": 0, "normal": 1, "solo": 2}
    return sorted(units, key=lambda u: order[u.kind])  # stable: by module name within a kind


def _may_start(u: Unit, running: list[Unit], jobs: int) -> bool:
    if len(running) >= jobs or any(r.kind == "solo" for r in running):
        return False
    if u.kind == "solo":
        return not running
    return u.kind != "heavy" or not any(r.kind == "heavy" for r in running)


def _env(u: Unit, jobs: int) -> dict[str, str]:
    """Units that may run beside another get one OpenMP thread each (torch's intra-op pool):
    two processes with a thread per core each oversubscribe the cores, and an OpenMP region
    waits for its slowest thread (measured: tests/test_native_backend.py took 41 s beside a
    SEAL module instead of 6 s alone). Solo units keep every core.

    Every unit, and every process it starts, runs with PYTHONSAFEPATH: a unit starts in the
    checkout, and `python -m` would put it first on sys.path, where each top-level folder
    shadows a distribution of the same import name. transformers >= 5.25 depends on
    Hugging Face's `kernels` and imports it at start-up, and got ours instead."""
    env = dict(os.environ, PYTHONSAFEPATH="1")
    if jobs > 1 and u.kind != "solo":
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def run(units: list[Unit], jobs: int, logdir: Path) -> None:
    pending, running = list(units), {}  # pid -> (unit, start, Popen)
    while pending or running:
        for u in list(pending):
            if _may_start(u, [r for r, _, _ in running.values()], jobs):
                u.log = logdir / (u.module.replace("/", "_") + ("_heavy" if u.marks == "he_heavy" else "") + ".log")
                cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5", "-m", u.marks,
                       u.module]
                with open(u.log, "w") as f:
                    p = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=_env(u, jobs))
                # the Popen is kept: one dropped while its child runs goes on subprocess's list of
                # orphans, whose next Popen reaps it if it has exited, before wait4 below can see it
                # (the unit would never report, and the solo units after it never start)
                running[p.pid] = (u, time.monotonic(), p)
                pending.remove(u)
        pid, status, usage = os.wait4(-1, 0)  # reaps the unit and its peak RSS (KB on Linux)
        if pid not in running:
            continue
        u, start, p = running.pop(pid)
        p.returncode = u.rc = os.waitstatus_to_exitcode(status)  # reaped here: subprocess must not wait for it
        u.seconds, u.peak_gb = time.monotonic() - start, usage.ru_maxrss / 2**20
        verdict = "ok" if u.rc in OK else f"FAILED (exit {u.rc})"
        print(f"\n== {u.name}: {verdict}, {u.seconds:.0f} s, peak {u.peak_gb:.1f} GB", flush=True)
        print(u.log.read_text().rstrip(), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-j", "--jobs", type=int, default=2, help="units run at once (default 2)")
    ap.add_argument("--collect", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("paths", nargs="*", default=["tests"])
    args = ap.parse_args()
    if args.collect:
        import pytest

        plugin = _Markers()
        rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *args.paths], plugins=[plugin])
        print(json.dumps(plugin.modules))
        return 0 if rc in OK else rc
    t0 = time.monotonic()
    units = collect(args.paths)
    with tempfile.TemporaryDirectory(prefix="veil-suite-") as tmp:
        run(units, max(1, args.jobs), Path(tmp))
    print(f"\n{'unit':<62} {'result':>7} {'s':>6} {'peak GB':>8}")
    for u in sorted(units, key=lambda u: -u.seconds):
        print(f"{u.name:<62} {'ok' if u.rc in OK else 'FAILED':>7} {u.seconds:>6.0f} {u.peak_gb:>8.1f}")
    failed = [u.name for u in units if u.rc not in OK]
    print(f"\n{len(units)} units, {len(failed)} failed, {time.monotonic() - t0:.0f} s wall")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
