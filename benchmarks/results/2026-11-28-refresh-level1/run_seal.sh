# The same on SEAL (its default keys: compact): the two-layer error three rounds
# alternated, then the k = 2 end-to-end pair:
#   cd benchmarks/results/2026-11-28-refresh-level1 && flock /tmp/veil-quiet.lock bash run_seal.sh
commits="a4a1ecd 79443eb"
source ../2026-11-27-rotations/commits.sh
for rep in 1 2 3; do
  for c in $commits; do
    run $c -m veil.benchmarks.protected_bench --contexts 16 --he-backend seal > $here/pb_ctx16_seal_${c}_run$rep.txt 2>&1
  done
done
for c in $commits; do
  run $c -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
    --he-backend seal --out $here/po_k2_ctx8_seal_$c.json > $here/po_k2_ctx8_seal_$c.txt 2>&1
  date -u +"%H:%M:%S $c seal done" >> $here/times.txt
done
