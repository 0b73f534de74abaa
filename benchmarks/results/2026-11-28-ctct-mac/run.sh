# protected_bench (native, contexts 16 and 64), dcc1f51 (before) vs cbc3611 (the tensor product
# through the multiply-accumulate), alternating, two pairs; then the ct x ct micro-benchmark on
# both. From this directory: flock /tmp/veil-quiet.lock bash run.sh
set -e
commits="dcc1f51 cbc3611"
source ../2026-11-27-rotations/commits.sh
for pair in 1 2; do
  for c in $commits; do
    echo "== $c pair $pair $(date -u +%T)"
    run $c -m veil.benchmarks.protected_bench --he-backend native --contexts 16,64 --out $here/pb_${c}_$pair.json \
      2>&1 | grep -v "it/s" > $here/pb_${c}_$pair.txt
  done
done
for c in $commits; do
  echo "== micro $c $(date -u +%T)"
  run $c $here/ctct_micro.py | tee $here/ctct_micro_$c.txt
done
echo "== end $(date -u +%T)"
