#!/usr/bin/env bash
# 02942ce (before) against 18018dd (veil_mac with the terms outer, accumulators in L1, the
# next term prefetched; 4edd4ac's in-place Basis.add between them), from this folder:
#   flock /tmp/veil-quiet.lock bash run.sh
# alternating pairs of he_ops and of the four products, then the k=2 protected path once each.
set -euo pipefail
commits="02942ce 18018dd"
source ../2026-11-27-rotations/commits.sh  # the worktrees and `run`
for i in 1 2; do
  for c in $commits; do
    run $c -m veil.benchmarks.he_ops --backends native --params ckks-n16384-l7-v2 --repeat 9 \
        --out $here/he_ops_${c}_$i.json > $here/he_ops_${c}_$i.txt 2>&1
  done
done
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
