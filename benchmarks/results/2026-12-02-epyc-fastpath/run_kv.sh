#!/bin/bash
# bf16 weights with the fp32 KV cache this CPU got (bf16_is_fast: AMX only) against a bf16 KV
# cache (forced by force_bf16_kv/sitecustomize.py), alternating, then the accuracy of the bf16
# cache against transformers. Run after run.sh (its vllm_cpu_bf16_1.json is the peer).
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-02-epyc-fastpath
run() { echo "== $1 $(date -u +%T)"; shift; "$@"; echo "rc=$? $(date -u +%T)"; }
veil() { .venv/bin/python -m veil.benchmarks.engine_throughput --paths fast,engine --dtype bfloat16 \
    --server-threads 2 --engine-threads 2 --peer "$R/vllm_cpu_bf16_1.json" --out "$R/$1.json"; }
for i in ${ROUNDS:-1 2}; do
  run fp32kv_$i veil kv_fp32_$i > "$R/kv_fp32_$i.txt" 2>&1
  run bf16kv_$i env PYTHONPATH=$R/force_bf16_kv bash -c "$(declare -f veil); R=$R; veil kv_bf16_$i" > "$R/kv_bf16_$i.txt" 2>&1
done
run acc env PYTHONPATH=$R/force_bf16_kv .venv/bin/python -m veil.benchmarks.accuracy --tokens 32 \
    --engine-dtypes float32,bfloat16 > "$R/accuracy_bf16kv.txt" 2>&1
