#!/bin/bash
# fp32 paged attention: the AVX-512 row kernel (d366441) against the generic loop before it
# (generic_attention/, the C source of 5315414), alternating: the step profile twice each, then
# the must-show workload once each. Same setup as ../2026-12-03-fp32-prepack.
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-03-fp32-attention
export VEIL_OLD_KERNELS=/tmp/veil-generic-attention.c
git show 5315414:kernels/llama_cpu.c > "$VEIL_OLD_KERNELS"
run() { echo "== $1 $(date -u +%T)"; shift; "$@"; echo "rc=$? $(date -u +%T)"; }
old() { env PYTHONPATH=$R/generic_attention "$@"; }
step() { .venv/bin/python -m veil.benchmarks.step_profile --dtype float32 --threads 2 --steps 8; }
veil() { .venv/bin/python -m veil.benchmarks.engine_throughput --paths fast,engine --dtype float32 \
    --server-threads 2 --engine-threads 2 --peer benchmarks/results/2026-12-03-fp32-prepack/vllm_cpu_fp32_1.json --out "$R/$1.json"; }
for i in 1 2; do
  run step_row_$i step > "$R/step_row_$i.txt" 2>&1
  run step_generic_$i old bash -c "$(declare -f step); step" > "$R/step_generic_$i.txt" 2>&1
done
run row veil row > "$R/row.txt" 2>&1
run generic old bash -c "$(declare -f veil); R=$R; veil generic" > "$R/generic.txt" 2>&1
