# Before (f4bf889: the framed hidden layout, refresh and h_L sent whole) and after (f0b2d63: both
# folded into the ring of N/2), back to back under the machine's quiet lock:
#   cd benchmarks/results/2026-11-28-folded-refresh && flock /tmp/veil-quiet.lock bash run.sh
# protected_overhead k = 2, context 8, 4 new tokens, native then SEAL (po_*); protected_bench
# --contexts 16 in three alternating rounds, native (pb_*); key_sets and he_ops at f0b2d63.
commits="f4bf889 f0b2d63"
source ../2026-11-27-rotations/commits.sh
overhead_pair native
bench_rounds native
run f0b2d63 -m veil.benchmarks.key_sets --out $here/key_sets.json > $here/key_sets.txt 2>&1
run f0b2d63 -m veil.benchmarks.he_ops --backends seal,native --out $here/he_ops.json > $here/he_ops.txt 2>&1
date -u +"%H:%M:%S key_sets, he_ops done" >> $here/times.txt
overhead_pair seal
date -u +"%H:%M:%S all done" >> $here/times.txt
