#!/usr/bin/env bash
# Native CPU key switching and encoding, the commit before this session (77022a0) against the
# session's kernels (78ec80e), alternating on one quiet machine, each from a worktree of its
# commit (commits.sh). From this folder:
#   flock /tmp/veil-quiet.lock bash run.sh
set -euo pipefail
commits="77022a0 78ec80e"
source commits.sh
side() { [ $1 = before ] && echo 77022a0 || echo 78ec80e; }
for i in 1 2; do
  for s in before after; do
    run $(side $s) -m veil.benchmarks.he_ops --backends native --params ckks-n16384-l7-v2 --repeat 9 \
        --out $here/he_ops_${s}_$i.json > $here/he_ops_${s}_$i.txt 2>&1
  done
done
for i in 1 2 3; do
  for s in before after; do
    run $(side $s) -m veil.benchmarks.protected_sessions --sessions 1 --warmup --out $here/sessions_${s}_$i.json 2>&1 \
        | grep -v "Converting\|Loading" > $here/sessions_${s}_$i.txt
  done
done
for s in before after; do
  run $(side $s) -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
      --he-backend native --out $here/protected_overhead_k2_${s}.json > $here/protected_overhead_k2_${s}.txt 2>&1
done
