# Before (9b8ef91: 14 consecutive copies) and after (f4bf889: the framed hidden layout), native
# backend, back to back under the machine's quiet lock:
#   cd benchmarks/results/2026-11-28-framed-hidden && flock /tmp/veil-quiet.lock bash run.sh
# protected_bench --contexts 16 in three alternating rounds (pb_*), then protected_overhead at
# k = 2, context 8, 4 new tokens (po_*), then the setup bytes of the three key sets (key_sets_*).
commits="9b8ef91 f4bf889"
source ../2026-11-27-rotations/commits.sh
bench_rounds native
overhead_pair native
for c in $commits; do
  run $c -m veil.benchmarks.key_sets --out $here/key_sets_$c.json > $here/key_sets_$c.txt 2>&1
done
date -u +"%H:%M:%S all done" >> $here/times.txt
