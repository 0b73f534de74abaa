# The two-layer output error (and the per-layer time and bytes) before and after, alternated,
# three rounds, on the backend named (native by default):
#   cd benchmarks/results/2026-11-28-refresh-level1 && flock /tmp/veil-quiet.lock bash run_bench.sh [native|seal]
commits="a4a1ecd 79443eb"
source ../2026-11-27-rotations/commits.sh
bench_rounds ${1:-native}
