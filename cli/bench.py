"""`veil bench`: a thin front over benchmarks/ (importable as `veil.benchmarks`)."""

from __future__ import annotations

import argparse

ENGINE_PATHS = {"reference", "fast"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure paths (reference, fast) and print `figure` lines",
                       add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    from veil.benchmarks import engine_throughput

    rest = list(args.rest)
    paths = "reference,fast"
    if "--paths" in rest:
        paths = rest[rest.index("--paths") + 1]
    unknown = set(paths.split(",")) - ENGINE_PATHS
    if unknown:
        print(f"error: paths {sorted(unknown)} are not measurable yet (available: {sorted(ENGINE_PATHS)})")
        return 2
    return engine_throughput.main(rest)
