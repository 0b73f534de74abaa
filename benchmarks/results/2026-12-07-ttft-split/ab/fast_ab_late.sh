cd /work/main
for round in 1 2; do
  for v in old late; do
    if [ $v = old ]; then cp /tmp/ab/heap.old kernels/heap.py; cp /tmp/ab/cli.old server/cli.py;
    else cp /tmp/ab/heap.py kernels/heap.py; cp /tmp/ab/cli.old server/cli.py; fi
    echo "== $v round $round $(date +%T)"
    PYTHONSAFEPATH=1 timeout 900 .venv/bin/python -m veil.benchmarks.engine_throughput --paths fast --dtype float32 \
      --server-threads 2 --out /tmp/ab/fast_${v}_${round}.json > /tmp/ab/fast_${v}_${round}.txt 2>&1
    grep -E "fast.output_tok_s|fast.tpot_s.mean|fast.errors" /tmp/ab/fast_${v}_${round}.txt
  done
done
cp /tmp/ab/heap.py kernels/heap.py; cp /tmp/ab/cli.old server/cli.py
echo "== done $(date +%T)"
