#!/usr/bin/env bash
# Native CPU kernels before (4acfeea) and after (the commit that adds this file), alternating:
#   flock /tmp/veil-quiet.lock bash run.sh
# "before" runs a worktree of 4acfeea through PYTHONPATH (/tmp/bw/veil -> the worktree).
set -euo pipefail
py=/work/main/.venv/bin/python
before=/tmp/before_k
[ -d $before ] || git -C /work/main worktree add -f $before 4acfeea
mkdir -p /tmp/bw && ln -sfn $before /tmp/bw/veil
b() { (cd /tmp && PYTHONPATH=/tmp/bw $py "$@"); }
a() { (cd /tmp && $py "$@"); }
here=$(pwd)
for i in 1 2; do
  b -m veil.benchmarks.he_ops --backends native --repeat 9 --out $here/he_ops_before_$i.json > $here/he_ops_before_$i.txt 2>&1
  a -m veil.benchmarks.he_ops --backends native --repeat 9 --out $here/he_ops_after_$i.json > $here/he_ops_after_$i.txt 2>&1
done
for i in 1 2 3 4; do
  b -m veil.benchmarks.protected_sessions --sessions 1 --warmup --out $here/sessions_before_$i.json 2>&1 | grep -v "Converting\|Loading" > $here/sessions_before_$i.txt
  a -m veil.benchmarks.protected_sessions --sessions 1 --warmup --out $here/sessions_after_$i.json 2>&1 | grep -v "Converting\|Loading" > $here/sessions_after_$i.txt
done
