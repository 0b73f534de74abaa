#!/usr/bin/env bash
# Evaluation-key sets (issue 21): bytes of each set, the products under each, and the protected
# path at k=2 before (feea95c: compact keys, whole relinearization key, RoPE at level 6) and
# after (this commit: RoPE at 5, the relinearization key for level 4, the minimal set), one
# after another on the 2-core VM under the quiet lock, nothing else running.
set -euo pipefail
OUT=benchmarks/results/2026-11-27-key-sets
PY=.venv/bin/python
run() { flock /tmp/veil-quiet.lock "$@"; }
run $PY -m veil.benchmarks.key_sets --backends seal,native --out $OUT/key_sets.json | tee $OUT/key_sets.txt
run $PY -m veil.benchmarks.protected_products --n1 16 --backends seal,native --keys full,compact,minimal \
    --repeat 3 --out $OUT/products.json | tee $OUT/products.txt
# (products.* were run again alone afterwards, the same command, after a fix to the key-switch count)
# before: the tree of feea95c on the same interpreter (a shim package of its folders ahead of the
# editable install: git worktree add /tmp/before feea95c; /tmp/before_pkg/veil/<dir> -> /tmp/before/<dir>)
PYTHONPATH=/tmp/before_pkg run $PY -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 \
    --max-new-tokens 4 --keys compact --out $OUT/protected_overhead_before_compact.json \
    > $OUT/protected_overhead_before_compact.txt 2>&1
for keys in compact minimal; do
  run $PY -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
      --keys $keys --out $OUT/protected_overhead_$keys.json > $OUT/protected_overhead_$keys.txt 2>&1
done
