# TTFT for a 64-token prompt and TPOT at context 64, k = 2, native backend, at a209432 (the
# chained W_qkv blocks on top of the folded refresh; m back at level 4), under the quiet lock:
#   cd benchmarks/results/2026-11-28-ttft64-native-3 && flock /tmp/veil-quiet.lock bash run.sh
commits="a209432"
source ../2026-11-27-rotations/commits.sh
run a209432 -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 64 --max-new-tokens 2 \
  --he-backend native --out $here/po_k2_ctx64_native_a209432.json > $here/po_k2_ctx64_native_a209432.txt 2>&1
date -u +"%H:%M:%S done" >> $here/times.txt
