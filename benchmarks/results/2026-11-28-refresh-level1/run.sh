# Before (a4a1ecd: the refresh at level 2 on Δ) and after (79443eb: at level 1 on 2^27), one after
# the other, under the quiet lock, on the backend named (native by default; SEAL's default keys
# are the compact set):
#   cd benchmarks/results/2026-11-28-refresh-level1 && flock /tmp/veil-quiet.lock bash run.sh [native|seal]
commits="a4a1ecd 79443eb"
source ../2026-11-27-rotations/commits.sh
overhead_pair ${1:-native}
