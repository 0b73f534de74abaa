#!/usr/bin/env bash
# The runs behind this folder's README, one after another under the machine's quiet lock:
#   flock /tmp/veil-quiet.lock bash benchmarks/results/2026-11-26-cpu-kernels/run.sh
# VEIL_CPU_KERNELS=0 runs the same code with the torch twins on the CPU (the "before").
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-11-26-cpu-kernels
PY=.venv/bin/python
stamp() { date -u +"$1 %FT%TZ"; }
stamp start
$PY -m veil.benchmarks.he_ops --backends seal,native --repeat 5 --out $R/he_ops.json > $R/he_ops.txt 2>&1
OMP_NUM_THREADS=1 $PY -m veil.benchmarks.he_ops --backends seal,native --repeat 5 --out $R/he_ops_1thread.json > $R/he_ops_1thread.txt 2>&1
VEIL_CPU_KERNELS=0 $PY -m veil.benchmarks.he_ops --backends seal,native --repeat 5 --out $R/he_ops_twins.json > $R/he_ops_twins.txt 2>&1
stamp he_ops
$PY -m veil.benchmarks.protected_sessions --sessions 1,4 --warmup --out $R/protected_sessions.json > $R/protected_sessions.txt 2>&1
VEIL_CPU_KERNELS=0 $PY -m veil.benchmarks.protected_sessions --sessions 1,4 --warmup --out $R/protected_sessions_twins.json > $R/protected_sessions_twins.txt 2>&1
stamp sessions
for he in native seal; do
  $PY -m veil.benchmarks.protected_overhead --paths protected --k 28 --contexts 2 --max-new-tokens 3 --he-backend $he \
    --out $R/protected_overhead_${he}_k28.json > $R/protected_overhead_${he}_k28.txt 2>&1
  stamp "overhead $he"
done
VEIL_CPU_KERNELS=0 $PY -m veil.benchmarks.protected_overhead --paths protected --k 28 --contexts 2 --max-new-tokens 3 \
  --he-backend native --out $R/protected_overhead_native_twins_k28.json > $R/protected_overhead_native_twins_k28.txt 2>&1
stamp "overhead twins"
$PY -m veil.benchmarks.protected_bench --he-backend seal,native --contexts 16 --out $R/protected_bench_ctx16.json \
  > $R/protected_bench_ctx16.txt 2>&1
stamp bench
for he in seal native; do
  .venv/bin/veil demo --mode protected --he-backend $he --max-new-tokens 4 > $R/demo_protected_$he.txt 2>&1
  stamp "demo $he"
done
