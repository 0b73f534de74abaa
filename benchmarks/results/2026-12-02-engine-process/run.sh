# veil serve with the engine loop in its own process (--engine-process) against the same server
# with it in the server's process and against the engine driven directly, one run per model, same
# workload and threads. Tiny random models of 2 and 3 layers (d = 64, ../2026-12-02-served/tiny_hf.py;
# the served-vs-direct set-up of ../2026-12-02-served-vs-direct): 256 requests of issue 22's shape at
# concurrency 256, one torch thread for the engine. Then the shipped SmolLM2 (fp32, the CPU default) on
# engine_throughput's must-show workload (64 requests, concurrency 16), the engine on torch's threads.
# `bash run.sh` here.
py=/work/main/.venv/bin/python
here=$(pwd)
served=$here/../2026-12-02-served
[ -d /tmp/tinyhf ] || (cd $served && $py tiny_hf.py /tmp/tinyhf /tmp/wl_tiny.json)
[ -d /tmp/tiny2hf ] || (cd $served && $py tiny_hf.py /tmp/tiny2hf /tmp/wl_tiny.json 2)
for m in ${MODELS:-tiny2hf tinyhf}; do
  $py -m veil.benchmarks.engine_throughput --paths fast,fast-process,engine --model /tmp/$m --workload /tmp/wl_tiny.json \
    --concurrency 256 --max-tokens-per-step 8192 --kv-cache-gb 2 --server-threads 1 --engine-threads 1 \
    --out $here/$m.json > $here/$m.txt 2>&1
  date -u +"%H:%M:%S $m done" >> $here/times.txt
done
if [ -z "$MODELS" ]; then
  $py -m veil.benchmarks.engine_throughput --paths fast,fast-process \
    --out $here/shipped_fp32.json > $here/shipped_fp32.txt 2>&1
  date -u +"%H:%M:%S shipped done" >> $here/times.txt
fi
