# protected_sessions --sessions 1,4 --warmup on the CPU (native, k=28), 1de7201 (before the C
# rounding and the batched zeros/serialization) vs 861b1a5, alternating, two pairs; then the
# rounding micro-benchmark on 861b1a5. Run from this directory under the quiet lock:
#   flock /tmp/veil-quiet.lock bash run.sh
set -e
commits="1de7201 861b1a5"
source ../2026-11-27-rotations/commits.sh
out=$here
for pair in 1 2; do
  for c in $commits; do
    echo "== $c pair $pair $(date -u +%T)"
    run $c -m veil.benchmarks.protected_sessions --sessions 1,4 --warmup --out $out/ps_${c}_$pair.json \
      2>&1 | grep -v "it/s" > $out/ps_${c}_$pair.txt
  done
done
echo "== micro $(date -u +%T)"
run 861b1a5 $here/rounding_micro.py $out/rounding_micro.json 2>&1 | tee $out/rounding_micro.txt | grep -v "^figure"
echo "== end $(date -u +%T)"
