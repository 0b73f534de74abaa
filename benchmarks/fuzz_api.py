"""Schemathesis against the app's OpenAPI schema: generated requests (valid and invalid bodies,
paths, parameters) on every operation of a real server; any 5xx is a finding.

    python -m veil.benchmarks.fuzz_api [--cases 10000] [--replicas N] [--serve-args "--engine-process"]

Starts a `veil serve` subprocess on loopback (a tenant with both scopes, max_context 64 so that
generated completions stay cheap; with ``--replicas``, a Ray Serve cluster of that many engine
replicas, every request through its ingress) and spreads ``--cases`` over the operations; operations whose
input space is small (GET /health) stop early, the others get more. Prints the number of cases
run per operation and `figure fuzz_api.cases N` / `figure fuzz_api.server_errors N`. The CI runs
~300 cases in-process (tests/test_fuzz_api.py).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from collections import Counter
from pathlib import Path


def fuzz(url: str, api_key: str, cases_per_operation: int) -> tuple[Counter, list[str]]:
    """Run schemathesis on every operation; returns (cases per operation, failures)."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error

    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    headers = {"Authorization": f"Bearer {api_key}"}
    ran: Counter = Counter()
    failures: list[str] = []
    for result in schema.get_all_operations():
        op = result.ok()
        label = op.label

        @settings(max_examples=cases_per_operation, deadline=None, suppress_health_check=list(HealthCheck),
                  database=None)
        @given(case=op.as_strategy())
        def run(case):
            ran[label] += 1  # noqa: B023 - run() is called right below, in this iteration
            case.call_and_validate(headers=headers, checks=[not_a_server_error], timeout=120)

        try:
            run()
        except (Exception, BaseExceptionGroup) as e:  # noqa: BLE001 - a finding, with its reproduction
            failures.append(f"{op.label}: {e}")
    return ran, failures


def main(argv: list[str] | None = None) -> int:
    from veil.benchmarks.engine_throughput import launch_server

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=10000, help="total cases to aim for")
    p.add_argument("--replicas", type=int, default=0, help="serve through a cluster of N replicas (0: one process)")
    p.add_argument("--serve-args", default="", help="more `veil serve` options, one string (e.g. \"--engine-process\")")
    args = p.parse_args(argv)
    serve_args = ["--max-context", "64", *shlex.split(args.serve_args)]
    with tempfile.TemporaryDirectory() as tmp:
        if args.replicas:
            from veil.benchmarks.cluster import launch_cluster

            srv = launch_cluster(Path(tmp), args.replicas, ("plaintext", "protected"), serve_args)
            proc, url, key = srv.proc, srv.url, srv.key
        else:
            proc, url, key = launch_server(Path(tmp), ("plaintext", "protected"), serve_args)
        try:
            import schemathesis

            n_ops = sum(1 for _ in schemathesis.openapi.from_url(f"{url}/openapi.json").get_all_operations())
            per_op = args.cases // max(1, n_ops - 4)  # ~4 operations have tiny input spaces
            ran, failures = fuzz(url, key, per_op)
        finally:
            proc.terminate()
            proc.wait(120)  # a cluster shuts Ray down first
    for label, n in sorted(ran.items()):
        print(f"# {label}: {n} cases", file=sys.stderr)
    for f in failures:
        print(f"# FAILURE {f[:2000]}", file=sys.stderr)
    print(f"figure fuzz_api.cases {sum(ran.values())}")
    print(f"figure fuzz_api.server_errors {len(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
