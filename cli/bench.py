"""`veil bench`: a thin front over benchmarks/ (importable as `veil.benchmarks`).

* ``veil bench --paths reference,fast,split-plain,protected --out DIR [--quick] ...`` — the overhead
  report (``veil.benchmarks.overhead``): every path in one run, results.json, report.md, plots;
  ``--replicas 1,2`` measures the server paths on ``veil serve --replicas N`` for each N.
* ``veil bench --paths reference,fast[,fast-process][,engine]`` with engine-throughput options only (no ``--out``,
  ``--quick`` or ``--contexts``) — the engine's throughput benchmark
  (``veil.benchmarks.engine_throughput``: 64 random requests at concurrency 16 against
  `transformers` static batches).
* ``veil bench --paths split-plain,protected --protected-overhead ...`` — the protected-path
  benchmark (``veil.benchmarks.protected_overhead``: k=2, context 64, 8 tokens by default).
* ``veil bench --paths protected --he-backend native --sessions 1,4,16 ...`` — protected sessions
  batched across (``veil.benchmarks.protected_sessions``: k=28, TPOT per session, aggregate
  tokens/s, server time by operation).
* ``veil bench --from EARLIER.json --peer PEER.json [--extraction ATTACK.json] --out DIR`` — the
  overhead report of an earlier run with a peer's rows (e.g. Concrete ML, ``make bench-concrete``)
  and the extraction attack added, nothing measured.
"""

from __future__ import annotations

import argparse

OVERHEAD_FLAGS = {"--out", "--quick", "--contexts", "--max-new-tokens", "--k", "--from", "--extraction", "--replicas"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure the paths (reference, fast, split-plain, protected); "
                                     "`veil bench --help` lists the options", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    from veil.benchmarks import engine_throughput, overhead, protected_overhead, protected_sessions

    rest = list(args.rest)
    if "--protected-overhead" in rest:
        rest.remove("--protected-overhead")
        return protected_overhead.main(rest)
    if "--sessions" in rest:
        return _sessions(rest, protected_sessions)
    paths = rest[rest.index("--paths") + 1] if "--paths" in rest else ",".join(overhead.ALL_PATHS)
    engine_only = (set(paths.split(",")) <= {"reference", "fast", "fast-process", "engine"}
                   and not OVERHEAD_FLAGS & set(rest))
    if "--help" in rest or "-h" in rest:
        # One parser's help names only its own flags: the modes first, then the overhead report's.
        print("Modes:\n" + __doc__.split("\n\n")[1].strip() + "\n\nThe overhead report's options:\n")
    if engine_only and "--help" not in rest and "-h" not in rest:
        return engine_throughput.main(rest)
    return overhead.main(rest)


def _sessions(rest: list[str], protected_sessions) -> int:
    """``--paths protected --he-backend native``: the only path and backend that batch sessions."""
    for flag, allowed in (("--paths", "protected"), ("--he-backend", "native")):
        if flag in rest:
            i = rest.index(flag)
            if rest[i + 1] != allowed:
                raise SystemExit(f"--sessions measures {flag} {allowed} only (got {rest[i + 1]!r})")
            del rest[i : i + 2]
    protected_sessions.main(rest)
    return 0
