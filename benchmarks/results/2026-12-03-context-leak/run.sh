# Before (027cbbb: the benchmark's new figures only) and after (7575aed: the context's caches
# per instance), each through PYTHONPATH from a worktree (../2026-11-27-rotations/commits.sh).
set -u
cd "$(dirname "$0")"
commits="027cbbb 7575aed"
. ../2026-11-27-rotations/commits.sh
for c in $commits; do
  run $c $here/leak_micro.py > leak_micro_$c.txt 2>&1
  run $c $here/heap_steps.py --sessions 4,4,4 --warmup --out /tmp/heap_$c.json > heap_steps_$c.txt 2>&1
  date -u +"%H:%M:%S $c leak and heap done" >> times.txt
done
for rep in 1 2; do
  for c in $commits; do
    run $c -m veil.benchmarks.protected_sessions --sessions 1,4 --warmup --out $here/ps_${c}_run$rep.json > ps_${c}_run$rep.txt 2>&1
    date -u +"%H:%M:%S $c sessions round $rep done" >> times.txt
  done
done
run 7575aed $here/shuffle_micro.py --repeat 3 > shuffle_micro_7575aed.txt 2>&1
