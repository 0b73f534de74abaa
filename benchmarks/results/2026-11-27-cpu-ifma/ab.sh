#!/usr/bin/env bash
# Native CPU kernels, a commit before against the working tree after, alternating on one quiet
# machine (two he_ops pairs, four k=28 session-step pairs). From this folder:
#   flock /tmp/veil-quiet.lock bash ab.sh 4acfeea ""        # the IFMA lanes and the C tails (at 474805b)
#   flock /tmp/veil-quiet.lock bash ab.sh 474805b wide_     # the NTT's 64-bit lanes (at 54e4949)
# "before" runs a worktree of that commit through PYTHONPATH (/tmp/ab-<commit>/veil -> the worktree).
set -euo pipefail
commit=$1 prefix=$2
py=/work/main/.venv/bin/python
before=/tmp/before-$commit
[ -d $before ] || git -C /work/main worktree add -f $before $commit
mkdir -p /tmp/ab-$commit && ln -sfn $before /tmp/ab-$commit/veil
b() { (cd /tmp && PYTHONPATH=/tmp/ab-$commit $py "$@"); }
a() { (cd /tmp && $py "$@"); }
here=$(pwd)
for i in 1 2; do
  for side in before after; do
    run=$([ $side = before ] && echo b || echo a)
    $run -m veil.benchmarks.he_ops --backends native --repeat 9 --out $here/${prefix}he_ops_${side}_$i.json \
        > $here/${prefix}he_ops_${side}_$i.txt 2>&1
  done
done
for i in 1 2 3 4; do
  for side in before after; do
    run=$([ $side = before ] && echo b || echo a)
    $run -m veil.benchmarks.protected_sessions --sessions 1 --warmup --out $here/${prefix}sessions_${side}_$i.json 2>&1 \
        | grep -v "Converting\|Loading" > $here/${prefix}sessions_${side}_$i.txt
  done
done
