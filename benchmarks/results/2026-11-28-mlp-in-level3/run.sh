# Before (9d26623: m uploaded at level 4, W_down m cleaned on Δ at 2, h'' moved onto 2^27 at 1)
# and after (8bf575c: m at 3, W_down m cleaned straight onto 2^27 at 1), back to back under the
# machine's quiet lock:
#   cd benchmarks/results/2026-11-28-mlp-in-level3 && flock /tmp/veil-quiet.lock bash run.sh
# protected_overhead k = 2, context 8, 4 new tokens, native then SEAL (po_*); protected_bench
# --contexts 16 in three alternating rounds on the native backend (pb_*); key_sets after.
commits="9d26623 8bf575c"
source ../2026-11-27-rotations/commits.sh
overhead_pair native
bench_rounds native
run 8bf575c -m veil.benchmarks.key_sets --out $here/key_sets.json > $here/key_sets.txt 2>&1
date -u +"%H:%M:%S key_sets done" >> $here/times.txt
overhead_pair seal
date -u +"%H:%M:%S all done" >> $here/times.txt
