#!/bin/bash
# A/B at 2 threads, back to back: before the engine loop owned the only OpenMP team (63a0eef) and after
cd /work/main
run() { echo "== $1 $(date -u +%T)"; shift; "$@"; echo "rc=$? $(date -u +%T)"; }
ET="-m veil.benchmarks.engine_throughput --paths fast,engine --dtype bfloat16 --server-threads 2 --engine-threads 2 --peer benchmarks/results/2026-11-26-cpu-fastpath/vllm_cpu_3.json"
run pre_team_t2 env PYTHONPATH=/tmp/pre_ns .venv/bin/python $ET --out benchmarks/results/2026-11-26-cpu-fastpath/ab_pre_team_t2.json
run post_team_t2 .venv/bin/python $ET --out benchmarks/results/2026-11-26-cpu-fastpath/ab_post_team_t2.json
