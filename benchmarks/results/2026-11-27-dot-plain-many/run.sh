#!/usr/bin/env bash
# 6567392 (before) against 5773a5c (dot_plain_many: a product's giant steps in one call over the baby
# steps), from this folder:
#   flock /tmp/veil-quiet.lock bash run.sh
# three alternating pairs of the four products, then the k=2 protected path once each.
set -euo pipefail
commits="6567392 5773a5c"
source ../2026-11-27-rotations/commits.sh  # the worktrees and `run`
for i in 1 2 3; do
  for c in $commits; do
    run $c -m veil.benchmarks.protected_products --n1 16 --backends native --repeat 5 \
        --out $here/products_${c}_$i.json 2>&1 | grep figure > $here/products_${c}_$i.txt
  done
done
for c in $commits; do
  run $c -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
      --he-backend native --out $here/protected_overhead_k2_native_$c.json 2>&1 \
      | grep -v "Converting\|Loading\|CKKS keys" > $here/protected_overhead_k2_native_$c.txt
done
