#!/usr/bin/env bash
# protected_bench (one decode step through two protected layers at context 16, in process), two
# alternating pairs, from this folder: flock /tmp/veil-quiet.lock bash run_layer.sh
set -euo pipefail
commits="6567392 5773a5c"
source ../2026-11-27-rotations/commits.sh
for i in 1 2; do for c in $commits; do
  run $c -m veil.benchmarks.protected_bench --contexts 16 --he-backend native --out $here/pb_${c}_$i.json 2>&1 | grep -i "figure\|matvec" > $here/pb_${c}_$i.txt
done; done
