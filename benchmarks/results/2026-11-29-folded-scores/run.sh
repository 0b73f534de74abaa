# Before (6f9722b: the scores download whole) and after (de86289: folded into the ring of N/2,
# the second half of a chunk's key blocks 32 slots into their block), under the quiet lock:
#   cd benchmarks/results/2026-11-29-folded-scores && flock /tmp/veil-quiet.lock bash run.sh
# key_sets at both commits; protected_overhead k = 2, context 8, 4 new tokens on the native
# backend (the full set its server names) at both; SEAL (compact, as its server names) after;
# the flooding margins on the native backend after.
commits="6f9722b de86289"
source ../2026-11-27-rotations/commits.sh
for c in $commits; do
  run $c -m veil.benchmarks.key_sets --out $here/key_sets_$c.json > $here/key_sets_$c.txt 2>&1
done
date -u +"%H:%M:%S key_sets done" >> $here/times.txt
overhead_pair native
new=${commits#* }
run $new -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
  --he-backend seal --out $here/po_k2_ctx8_seal_$new.json > $here/po_k2_ctx8_seal_$new.txt 2>&1
date -u +"%H:%M:%S $new seal done" >> $here/times.txt
run $new -m veil.benchmarks.flooding_margin --he-backend native --out $here/flooding_margin_native.json \
  > $here/flooding_margin_native.txt 2>&1
date -u +"%H:%M:%S all done" >> $here/times.txt
