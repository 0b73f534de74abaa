# A/B of one arena in `veil serve`: alternate old (arenas as glibc makes them) and new code.
cd /work/main
for round in 1 2; do
  for v in old new; do
    if [ $v = old ]; then cp /tmp/ab/heap.old kernels/heap.py; cp /tmp/ab/cli.old server/cli.py;
    else cp /tmp/ab/heap.py kernels/heap.py; cp /tmp/ab/cli.py server/cli.py; fi
    echo "== $v round $round $(date +%T)"
    PYTHONSAFEPATH=1 timeout 1200 .venv/bin/python -m veil.benchmarks.protected_overhead --paths protected --k 2 \
      --contexts 8 --max-new-tokens 3 --he-backend native --out /tmp/ab/po_${v}_${round}.json > /tmp/ab/po_${v}_${round}.txt 2>&1
    grep -E "ttft_s|tpot_s.mean|ttft_server_s.(matvec|rotations|shuffle)|server_s.(matvec|rotations)\.|kl_mean" /tmp/ab/po_${v}_${round}.txt
  done
done
cp /tmp/ab/heap.py kernels/heap.py; cp /tmp/ab/cli.py server/cli.py
echo "== done $(date +%T)"
