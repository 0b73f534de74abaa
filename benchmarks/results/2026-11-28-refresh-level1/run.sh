# Before (a4a1ecd: the refresh at level 2 on Δ) and after (79443eb: at level 1 on 2^27), one after
# the other, under the quiet lock:
#   cd benchmarks/results/2026-11-28-refresh-level1 && flock /tmp/veil-quiet.lock bash run.sh
commits="a4a1ecd 79443eb"
source ../2026-11-27-rotations/commits.sh
for c in $commits; do
  run $c -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
    --he-backend native --out $here/po_k2_ctx8_native_$c.json > $here/po_k2_ctx8_native_$c.txt 2>&1
  date -u +"%H:%M:%S $c done" >> $here/times.txt
done
