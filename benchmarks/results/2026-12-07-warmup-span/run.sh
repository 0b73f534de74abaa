#!/usr/bin/env bash
# Before (the tree at BEFORE, default HEAD, through a `veil` namespace of symlinks on PYTHONPATH)
# and after (this checkout), alternating, ROUNDS rounds; one JSON line each to ab.jsonl.
#   bash benchmarks/results/2026-12-07-warmup-span/run.sh [K]
set -euo pipefail
cd "$(dirname "$0")/../../.."
K=${1:-28} ROUNDS=${ROUNDS:-2} BEFORE=${BEFORE:-HEAD}
rm -rf /tmp/wt-before /tmp/nsb && mkdir -p /tmp/wt-before /tmp/nsb/veil
git archive "$BEFORE" | tar -x -C /tmp/wt-before
for d in client server crypto protected engine kernels cli benchmarks cluster; do ln -sfn /tmp/wt-before/$d /tmp/nsb/veil/$d; done
here=benchmarks/results/2026-12-07-warmup-span
for r in $(seq "$ROUNDS"); do
  PYTHONSAFEPATH=1 PYTHONPATH=/tmp/nsb .venv/bin/python $here/first_prompt.py "before-$(git rev-parse --short "$BEFORE")" "$K" | tee -a $here/ab.jsonl
  PYTHONSAFEPATH=1 .venv/bin/python $here/first_prompt.py after "$K" | tee -a $here/ab.jsonl
done
