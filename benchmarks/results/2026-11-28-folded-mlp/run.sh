# Before (3ebff4a: the MLP download whole) and after (912481b: folded into the ring of N/2), one
# after the other, under the quiet lock, on the backend named (native by default; SEAL's default
# keys are the compact set):
#   cd benchmarks/results/2026-11-28-folded-mlp && flock /tmp/veil-quiet.lock bash run.sh [native|seal]
be=${1:-native}
commits="3ebff4a 912481b"
source ../2026-11-27-rotations/commits.sh
for c in $commits; do
  run $c -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
    --he-backend $be --out $here/po_k2_ctx8_${be}_$c.json > $here/po_k2_ctx8_${be}_$c.txt 2>&1
  date -u +"%H:%M:%S $c $be done" >> $here/times.txt
done
