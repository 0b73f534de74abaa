# A/B of M_TRIM_THRESHOLD 2^31-1 (old) against -1 (new, never trim), alternating, in one sitting:
# a k=2 protected session's 16-token prompt (two spans of 8) and 2 tokens, server HE by kind.
cd /work/main
D=benchmarks/results/2026-12-07-first-prompt/ab
for round in ${ROUNDS:-1}; do
  for v in old new; do
    cp /tmp/ab_heap.$v kernels/heap.py
    echo "== $v round $round $(date +%T)"
    PYTHONSAFEPATH=1 timeout 1500 .venv/bin/python -m veil.benchmarks.protected_overhead --paths protected --k 2 \
      --contexts 16 --max-new-tokens 2 --he-backend native --out $D/po_${v}_${round}.json > $D/po_${v}_${round}.txt 2>&1
    grep -E "TTFT|ttft_server_s.(matvec|rotations|shuffle)|server_peak" $D/po_${v}_${round}.txt
  done
done
cp /tmp/ab_heap.new kernels/heap.py
echo "== done $(date +%T)"
