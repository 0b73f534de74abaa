#!/usr/bin/env bash
# The protected path at k=2 on both backends in one sitting (native with this change, SEAL as the
# reference), from the repository root: bash benchmarks/results/2026-11-27-cpu-ifma/run_k2.sh
set -euo pipefail
OUT=benchmarks/results/2026-11-27-cpu-ifma
PY=.venv/bin/python
for be in native seal; do
  flock /tmp/veil-quiet.lock $PY -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 \
      --max-new-tokens 4 --he-backend $be --out $OUT/protected_overhead_k2_$be.json \
      > $OUT/protected_overhead_k2_$be.txt 2>&1
done
# then, after the NTT's 64-bit lanes (54e4949), native again:
#   flock /tmp/veil-quiet.lock .venv/bin/python -m veil.benchmarks.protected_overhead --paths protected --k 2 \
#       --contexts 8 --max-new-tokens 4 --he-backend native --out $OUT/protected_overhead_k2_native_wide.json \
#       > $OUT/protected_overhead_k2_native_wide.txt 2>&1
