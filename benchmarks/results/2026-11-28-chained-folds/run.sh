# Before (330e894: W_qkv's three blocks per frame summed by halving a fold of four, keys for
# 960 and 1920) and after (7a0a1e3: a chain of two rotations by 960, one key), under the machine's
# quiet lock:
#   cd benchmarks/results/2026-11-28-chained-folds && flock /tmp/veil-quiet.lock bash run.sh
# key_sets at both commits; protected_overhead k = 2, context 8, 4 new tokens on the native
# backend with the set its server names (full) at both, then with the compact set after, then
# full again (the spread); SEAL with the set its server names (compact) after.
commits="330e894 7a0a1e3"
source ../2026-11-27-rotations/commits.sh
for c in $commits; do
  run $c -m veil.benchmarks.key_sets --out $here/key_sets_$c.json > $here/key_sets_$c.txt 2>&1
done
date -u +"%H:%M:%S key_sets done" >> $here/times.txt
overhead_pair native
new=${commits#* }
run $new -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
  --he-backend native --keys compact --out $here/po_k2_ctx8_native_compact_$new.json > $here/po_k2_ctx8_native_compact_$new.txt 2>&1
date -u +"%H:%M:%S $new native compact done" >> $here/times.txt
run $new -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
  --he-backend native --out $here/po_k2_ctx8_native_${new}_again.json > $here/po_k2_ctx8_native_${new}_again.txt 2>&1
date -u +"%H:%M:%S $new native full again done" >> $here/times.txt
run $new -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
  --he-backend seal --out $here/po_k2_ctx8_seal_$new.json > $here/po_k2_ctx8_seal_$new.txt 2>&1
date -u +"%H:%M:%S all done" >> $here/times.txt
