#!/usr/bin/env bash
# The NTT's vector stages for the 55/57-bit primes too: before (474805b, 36-bit primes only) and
# after (the commit that adds this file), alternating, quiet machine:
#   flock /tmp/veil-quiet.lock bash run_wide.sh   (from this folder)
set -euo pipefail
py=/work/main/.venv/bin/python
before=/tmp/before_w
[ -d $before ] || git -C /work/main worktree add -f $before 474805b
mkdir -p /tmp/bw2 && ln -sfn $before /tmp/bw2/veil
b() { (cd /tmp && PYTHONPATH=/tmp/bw2 $py "$@"); }
a() { (cd /tmp && $py "$@"); }
here=$(pwd)
for i in 1 2; do
  b -m veil.benchmarks.he_ops --backends native --repeat 9 --out $here/wide_he_ops_before_$i.json > $here/wide_he_ops_before_$i.txt 2>&1
  a -m veil.benchmarks.he_ops --backends native --repeat 9 --out $here/wide_he_ops_after_$i.json > $here/wide_he_ops_after_$i.txt 2>&1
done
for i in 1 2 3 4; do
  b -m veil.benchmarks.protected_sessions --sessions 1 --warmup --out $here/wide_sessions_before_$i.json 2>&1 | grep -v "Converting\|Loading" > $here/wide_sessions_before_$i.txt
  a -m veil.benchmarks.protected_sessions --sessions 1 --warmup --out $here/wide_sessions_after_$i.json 2>&1 | grep -v "Converting\|Loading" > $here/wide_sessions_after_$i.txt
done
