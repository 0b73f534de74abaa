# Before (28d0fda) and after (eb7c0d7), one after the other, under the quiet lock:
#   cd benchmarks/results/2026-11-28-ttft64-weights-window && flock /tmp/veil-quiet.lock bash run.sh
commits="28d0fda eb7c0d7"
source ../2026-11-27-rotations/commits.sh
for c in $commits; do
  run $c -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 64 --max-new-tokens 2 \
    --he-backend native --out $here/po_k2_ctx64_native_$c.json > $here/po_k2_ctx64_native_$c.txt 2>&1
  date -u +"%H:%M:%S $c done" >> $here/times.txt
done
