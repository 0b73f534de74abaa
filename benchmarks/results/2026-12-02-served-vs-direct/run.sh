# The served fast path against the engine driven directly, one run each model, same workload
# and threads: what streaming through `veil serve` (event loop and engine loop on one GIL) costs
# when the forward pass is short. Tiny random models of 2 and 3 layers (d = 64; veil serve splits at k = 2, so no fewer;
# ../2026-12-02-served/tiny_hf.py), 256 requests of issue 22's shape at concurrency 256 (256
# sequences per step), one torch thread for the server or the engine, the load generator on the
# other core. `bash run.sh` here.
py=/work/main/.venv/bin/python
here=$(pwd)
served=$here/../2026-12-02-served
[ -d /tmp/tinyhf ] || (cd $served && $py tiny_hf.py /tmp/tinyhf /tmp/wl_tiny.json)
[ -d /tmp/tiny2hf ] || (cd $served && $py tiny_hf.py /tmp/tiny2hf /tmp/wl_tiny.json 2)
for m in ${MODELS:-tiny2hf tinyhf}; do
  $py -m veil.benchmarks.engine_throughput --paths fast,engine --model /tmp/$m --workload /tmp/wl_tiny.json \
    --concurrency 256 --max-tokens-per-step 8192 --kv-cache-gb 2 --server-threads 1 --engine-threads 1 \
    --out $here/$m.json > $here/$m.txt 2>&1
  date -u +"%H:%M:%S $m done" >> $here/times.txt
done
