#!/bin/bash
# Exclusive job: wait (at most 10 min) until no other process uses CPU, then the must-show back to back.
cd /work/wt-fast
O=bench_out/m
busy() { top -b -n 2 -d 3 | awk '/^top -/{n++} n==2 && $1 ~ /^[0-9]+$/ && $9+0 > 15 {print $9, $12}'; }
for i in $(seq 1 60); do b=$(busy); [ -z "$b" ] && break; echo "$(date -u +%T) waiting for: $b" | head -3; sleep 7; done
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD)"; cat /proc/loadavg
for dt in float32 bfloat16; do
  echo "== step_profile $dt threads 2"
  .venv/bin/python -m veil.benchmarks.step_profile --dtype $dt --threads 2 --steps 8 2>$O/step_profile_${dt}_2.txt | tee $O/step_profile_${dt}_2.figures
done
best=$(.venv/bin/python -c "
f=lambda d: float([l.split()[2] for l in open('$O/step_profile_'+d+'_2.figures') if l.startswith('figure step.tok_s')][0])
print(max(('float32','bfloat16'), key=f))")
echo "faster dtype (steady decode step, 2 threads): $best"; cat /proc/loadavg
echo "== make bench-peers  $(date -u +%FT%TZ)"
make bench-peers 2>&1 | grep -E "^figure|Error|error" | head -20
echo "== engine_throughput fast,engine --dtype $best --peer  $(date -u +%FT%TZ)"; cat /proc/loadavg
.venv/bin/python -m veil.benchmarks.engine_throughput --paths fast,engine --dtype $best \
    --peer bench_out/peers/vllm_cpu.json --out $O/engine_throughput.json 2>&1 | grep -vE "Converting|Loading|it/s"
echo "end $(date -u +%FT%TZ)"; cat /proc/loadavg
