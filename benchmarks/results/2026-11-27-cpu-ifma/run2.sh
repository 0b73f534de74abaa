#!/usr/bin/env bash
# Two more alternating pairs of the k=28 session step (after run.sh; same set-up):
#   flock /tmp/veil-quiet.lock bash run2.sh
set -euo pipefail
py=/work/main/.venv/bin/python
b() { (cd /tmp && PYTHONPATH=/tmp/bw $py "$@"); }
a() { (cd /tmp && $py "$@"); }
here=$(pwd)
for i in 3 4; do
  b -m veil.benchmarks.protected_sessions --sessions 1 --warmup --out $here/sessions_before_$i.json 2>&1 | grep -v "Converting\|Loading" > $here/sessions_before_$i.txt
  a -m veil.benchmarks.protected_sessions --sessions 1 --warmup --out $here/sessions_after_$i.json 2>&1 | grep -v "Converting\|Loading" > $here/sessions_after_$i.txt
done
