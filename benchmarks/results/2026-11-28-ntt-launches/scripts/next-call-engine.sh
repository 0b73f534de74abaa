# Superseded (2026-12-02) by ../../../device/issue19.sh and issue22.sh, which build on kit.sh; kept as the record.
# The next device session's second call (issue 22), after next-call.sh (the setup runs again:
# it exports the paths every call needs). Carry [".gpukit"], timeout_s 330:
#   bash benchmarks/results/2026-11-28-ntt-launches/scripts/next-call-engine.sh
# The 256-request workload of issue 22 with the engine's overlapped loop (EngineConfig.overlap,
# 291a954: never run on a GPU yet) and without it, then transformers in static batches of 256,
# in one run. 2026-11-28 (before the overlap): H100 22,717 output tok/s, 69.5% of the wall time
# inside steps; H200 20,790 vs transformers 1,421.6.
source .gpukit/setup.sh > /tmp/setup.txt 2>&1; tail -3 /tmp/setup.txt
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; stamp() { echo "== $1 at $(el) s" | tee -a $OUT/log.txt; }
git log --oneline -1 2>/dev/null | tee -a $OUT/log.txt; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/log.txt
w="--device cuda --model /tmp/model --num-requests 256 --input-len 100,1024 --output-len 100,1024 --concurrency 256 --kv-cache-gb 40 --max-tokens-per-step 8192"
keep() { grep -v "it/s" | grep -v "figure .*\.\(p95\|p99\|p50\)"; }
stamp engine_overlap
timeout 90 python3 -m veil.benchmarks.engine_throughput $w --paths engine --out $OUT/engine_overlap.json 2>&1 | keep > $OUT/engine_overlap.txt; grep -E "output_tok_s|steps_s|step_time_share|mean_seqs|host_ms" $OUT/engine_overlap.txt
stamp engine_no_overlap
timeout 90 python3 -m veil.benchmarks.engine_throughput $w --paths engine --no-overlap --out $OUT/engine_no_overlap.json 2>&1 | keep > $OUT/engine_no_overlap.txt; grep -E "output_tok_s|steps_s|step_time_share|mean_seqs|host_ms" $OUT/engine_no_overlap.txt
stamp reference
timeout $(( 310 - $(el) )) python3 -m veil.benchmarks.engine_throughput $w --paths reference --batch-size 256 --reference-dtypes bfloat16 --out $OUT/reference.json 2>&1 | keep > $OUT/reference.txt; grep -E "output_tok_s" $OUT/reference.txt
stamp end
