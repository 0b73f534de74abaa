#!/bin/bash
cd /work/main
for t in 1 2; do echo "== engine_bf16_t$t $(date -u +%T)"; .venv/bin/python -m veil.benchmarks.engine_throughput --paths engine --dtype bfloat16 --engine-threads $t --out benchmarks/results/2026-11-26-cpu-fastpath/engine_bf16_threads$t.json; echo "rc=$? $(date -u +%T)"; done
