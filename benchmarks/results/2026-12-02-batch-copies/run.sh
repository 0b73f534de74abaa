#!/usr/bin/env bash
# Batched protected sessions before (BASE, a worktree of the parent commit) and after (this
# checkout), alternating, on the same machine in one run:
#   git worktree add /tmp/base <parent> && bash benchmarks/results/2026-12-02-batch-copies/run.sh
# run_at.py imports the veil package from the given tree (the editable install maps it to this one).
set -e
cd "$(dirname "$0")/../../.."
OUT=benchmarks/results/2026-12-02-batch-copies
BASE=${BASE:-/tmp/base}
for round in ${ROUNDS:-1 2}; do
  for tree in base new; do
    root=$PWD; [ $tree = base ] && root=$BASE
    .venv/bin/python $OUT/run_at.py "$root" veil.benchmarks.protected_sessions --sessions 1,4 --warmup \
      --out $OUT/ps_${tree}_$round.json 2>&1 | grep -v "it/s" > $OUT/ps_${tree}_$round.txt
    echo "$(date -u +%T) $tree $round $(grep aggregate_speedup $OUT/ps_${tree}_$round.txt)"
  done
done
