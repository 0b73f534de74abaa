# Before (28d0fda) and after (eb7c0d7), alternating, under the quiet lock:
#   cd benchmarks/results/2026-11-28-weights-window && flock /tmp/veil-quiet.lock bash run.sh
commits="28d0fda eb7c0d7"
source ../2026-11-27-rotations/commits.sh
for pair in 1 2; do
  for c in $commits; do
    run $c -m veil.benchmarks.protected_bench --he-backend native --contexts 16,64,128 \
      --out $here/pb_native_${c}_$pair.json > $here/pb_native_${c}_$pair.txt 2>&1
  done
done
for c in $commits; do
  run $c -m veil.benchmarks.protected_bench --he-backend seal --contexts 64 \
    --out $here/pb_seal_${c}.json > $here/pb_seal_${c}.txt 2>&1
done
