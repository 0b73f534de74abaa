# A/B of the replicas' start-up arena limit: alternate old (cluster/launch.py at 816463e, no
# runtime_env) and new code, two rounds; one JSON line per run.
cd /work/main
mkdir -p /tmp/arena_ab && git show 816463e:cluster/launch.py > /tmp/arena_ab/launch.old && cp cluster/launch.py /tmp/arena_ab/launch.new
for round in 1 2; do
  for v in old new; do
    cp /tmp/arena_ab/launch.$v cluster/launch.py
    PYTHONSAFEPATH=1 timeout 900 .venv/bin/python benchmarks/results/2026-12-07-ci-heap/replica_arena.py ${v}_$round 2>/dev/null | tail -1
  done
done
cp /tmp/arena_ab/launch.new cluster/launch.py
