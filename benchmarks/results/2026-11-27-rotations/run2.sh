#!/usr/bin/env bash
# At 1002587 (this session's last kernel and the span batching on the CPU), from this folder:
#   flock /tmp/veil-quiet.lock bash run2.sh
# the NTT's small stages against 78ec80e (two alternating he_ops pairs), a span's products one
# by one and batched, one and four sessions, the k=2 protected path on both backends, and the
# heap micro-benchmark.
set -euo pipefail
commits="78ec80e 1002587"
source commits.sh
for i in 1 2; do
  for c in 78ec80e 1002587; do
    run $c -m veil.benchmarks.he_ops --backends native --params ckks-n16384-l7-v2 --repeat 9 \
        --out $here/ntt_he_ops_${c}_$i.json > $here/ntt_he_ops_${c}_$i.txt 2>&1
  done
done
run 1002587 -m veil.benchmarks.protected_products --n1 16 --backends native --positions 8 --repeat 3 \
    --out $here/products_native_positions8.json > $here/products_native_positions8.txt 2>&1
run 1002587 -m veil.benchmarks.protected_sessions --sessions 1,4 --warmup --out $here/sessions_1_4.json 2>&1 \
    | grep -v "Converting\|Loading" > $here/sessions_1_4.txt
for be in native seal; do
  run 1002587 -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
      --he-backend $be --out $here/protected_overhead_k2_${be}_1002587.json \
      > $here/protected_overhead_k2_${be}_1002587.txt 2>&1
done
(cd /tmp && $py $here/heap_micro.py > $here/heap_micro.txt 2>&1 && $py $here/heap_micro.py keep >> $here/heap_micro.txt 2>&1)
