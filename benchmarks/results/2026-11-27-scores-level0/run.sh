#!/bin/bash
# Issue 21: the scores download at level 0 (before: 8552eea in a worktree at /tmp/bef/veil,
# imported ahead of the editable install; after: this tree). Back to back, same command, then
# the flooding margins of both and the level-0 headroom on real text.
# flock /tmp/veil-quiet.lock bash benchmarks/results/2026-11-27-scores-level0/run.sh
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-11-27-scores-level0
CMD="-m veil.benchmarks.protected_overhead --k 2 --contexts 8 --max-new-tokens 4"
BEFORE="env -C /tmp PYTHONPATH=/tmp/bef /work/main/.venv/bin/python"
echo "before start $(date -u +%T)"
$BEFORE $CMD --out /work/main/$R/protected_overhead_before.json > $R/protected_overhead_before.txt 2>&1
echo "rc=$? after start $(date -u +%T)"
.venv/bin/python $CMD --out $R/protected_overhead_after.json > $R/protected_overhead_after.txt 2>&1
echo "rc=$? margins $(date -u +%T)"
$BEFORE -m veil.benchmarks.flooding_margin --out /work/main/$R/flooding_margin_before.json > $R/flooding_margin_before.txt 2>&1
echo "rc=$? $(date -u +%T)"
.venv/bin/python -m veil.benchmarks.flooding_margin --out $R/flooding_margin_after.json > $R/flooding_margin_after.txt 2>&1
echo "rc=$? $(date -u +%T)"
.venv/bin/python -m veil.benchmarks.download_ranges --out $R/download_ranges.json > $R/download_ranges.txt 2>&1
echo "rc=$? end $(date -u +%T)"
