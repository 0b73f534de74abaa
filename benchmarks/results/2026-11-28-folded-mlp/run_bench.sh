# The two-layer output error (and a layer's time and bytes) before and after, alternated, three
# rounds, on the backend named (native by default):
#   cd benchmarks/results/2026-11-28-folded-mlp && flock /tmp/veil-quiet.lock bash run_bench.sh [native|seal]
be=${1:-native}
commits="3ebff4a 912481b"
source ../2026-11-27-rotations/commits.sh
for rep in 1 2 3; do
  for c in $commits; do
    run $c -m veil.benchmarks.protected_bench --contexts 16 --he-backend $be > $here/pb_ctx16_${be}_${c}_run$rep.txt 2>&1
  done
done
