#!/bin/bash
# fp32 paged attention built for AVX2 + FMA: the 8-lane row kernel against the generic loop the
# same build took before it (the C source of 2a9a17c), alternating: the kernel alone, then the
# step profile twice each with the whole engine's kernels built -mavx2 -mfma (avx2_build/).
# The GEMMs stay oneDNN's (AVX-512 here): only the attention's build differs.
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-03-avx2-attention
OLD=/tmp/veil-before-avx2-row.c
git show 2a9a17c:kernels/llama_cpu.c > "$OLD"
run() { echo "== $1 $(date -u +%T)"; shift; "$@"; echo "rc=$? $(date -u +%T)"; }
step() { .venv/bin/python -m veil.benchmarks.step_profile --dtype float32 --threads 2 --steps 8; }
run micro .venv/bin/python $R/attention_micro.py "$OLD" > "$R/attention_micro.txt" 2>&1
for i in 1 2; do
  run step_row_$i env PYTHONPATH=$R/avx2_build bash -c "$(declare -f step); step" > "$R/step_row_$i.txt" 2>&1
  run step_generic_$i env PYTHONPATH=$R/avx2_build VEIL_KERNEL_SOURCE=$OLD bash -c "$(declare -f step); step" \
      > "$R/step_generic_$i.txt" 2>&1
done
