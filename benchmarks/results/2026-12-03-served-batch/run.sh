#!/usr/bin/env bash
# protected_sessions at 1 and 4 sessions, three rounds alternating two commits:
#   c628ffa (fresh): every step on fresh sessions and key sets, --warmup 3, the step at position 15;
#   497a602 (served): --steps, the same sessions, keys and caches for every step: one untimed step
#            at position 12, then the steps at 13, 14 and 15 timed (figures: their mean).
# Each commit through PYTHONPATH from a worktree (../2026-11-27-rotations/commits.sh). Run with
# nothing beside it: bash benchmarks/results/2026-12-03-served-batch/run.sh
set -u
cd "$(dirname "$0")"
commits="c628ffa 497a602"
. ../2026-11-27-rotations/commits.sh
for rep in 1 2 3; do
  run c628ffa -m veil.benchmarks.protected_sessions --sessions 1,4 --warmup 3 \
      --out $here/fresh_run$rep.json > fresh_run$rep.txt 2>&1
  date -u +"%H:%M:%S fresh round $rep done" >> times.txt
  run 497a602 -m veil.benchmarks.protected_sessions --sessions 1,4 --ctx 13 --warmup 1 --steps 3 \
      --out $here/served_run$rep.json > served_run$rep.txt 2>&1
  date -u +"%H:%M:%S served round $rep done" >> times.txt
done
for c in $commits; do git -C /work/main worktree remove --force /tmp/wt-$c; done
