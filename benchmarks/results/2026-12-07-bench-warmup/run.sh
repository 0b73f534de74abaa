#!/usr/bin/env bash
# protected_bench's first step against a warm one, alternating, two rounds (from the checkout)
set -euo pipefail
here=benchmarks/results/2026-12-07-bench-warmup
for r in 1 2; do
  for w in no-warmup warmup; do
    PYTHONSAFEPATH=1 python -m veil.benchmarks.protected_bench --he-backend native --contexts 16 --$w \
      --out /tmp/wab/$w-$r.json > $here/$w-$r.txt 2>&1
  done
done
