# The two-layer output error (and a layer's time and bytes) before and after, alternated, three
# rounds, on the backend named (native by default):
#   cd benchmarks/results/2026-11-28-folded-mlp && flock /tmp/veil-quiet.lock bash run_bench.sh [native|seal]
commits="3ebff4a 912481b"
source ../2026-11-27-rotations/commits.sh
bench_rounds ${1:-native}
