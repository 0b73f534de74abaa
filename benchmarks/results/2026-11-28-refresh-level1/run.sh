# Before (a4a1ecd: the refresh at level 2 on Δ) and after (79443eb: at level 1 on 2^27), one after
# the other, under the quiet lock, on the backend named (native by default; SEAL's default keys
# are the compact set):
#   cd benchmarks/results/2026-11-28-refresh-level1 && flock /tmp/veil-quiet.lock bash run.sh [native|seal]
be=${1:-native}
commits="a4a1ecd 79443eb"
source ../2026-11-27-rotations/commits.sh
for c in $commits; do
  run $c -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
    --he-backend $be --out $here/po_k2_ctx8_${be}_$c.json > $here/po_k2_ctx8_${be}_$c.txt 2>&1
  date -u +"%H:%M:%S $c $be done" >> $here/times.txt
done
