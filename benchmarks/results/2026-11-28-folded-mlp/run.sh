# Before (3ebff4a: the MLP download whole) and after (912481b: folded into the ring of N/2), one
# after the other, under the quiet lock, on the backend named (native by default; SEAL's default
# keys are the compact set):
#   cd benchmarks/results/2026-11-28-folded-mlp && flock /tmp/veil-quiet.lock bash run.sh [native|seal]
commits="3ebff4a 912481b"
source ../2026-11-27-rotations/commits.sh
overhead_pair ${1:-native}
