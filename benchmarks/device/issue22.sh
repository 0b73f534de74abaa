# Issue 22's checks on the lent GPU (the fast path on CUDA). One call, carry [".gpukit"],
# timeout_s 330, best on the machine issue19.sh left warm:
#   bash benchmarks/device/issue22.sh
# The 256-request workload (input and output lengths uniform in [100, 1024], EOS ignored) with
# the engine driven directly, with its overlapped loop (EngineConfig.overlap, never run on a GPU
# yet) and without; transformers bf16 `generate` in static batches of 256 in the same call; then
# `veil serve --device cuda` at concurrency 256 (the served path's host ms per engine step). Last
# figures: ../results/2026-11-28-gpu/ (H100 22,717 output tok/s; H200 20,790 against 1,421.6).
source benchmarks/device/setup.sh > "$OUT/setup.txt" 2>&1 || { cat "$OUT/setup.txt"; exit 1; }
tail -2 "$OUT/setup.txt"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; stamp() { echo "== $1 at $(el) s" | tee -a "$OUT/log.txt"; }
git log --oneline -1 2>/dev/null | tee -a "$OUT/log.txt"
w="--device cuda --model /tmp/model --num-requests 256 --input-len 100,1024 --output-len 100,1024 --concurrency 256 --kv-cache-gb 40 --max-tokens-per-step 8192"
keep() { grep -v "it/s" | grep -v "figure .*\.\(p95\|p99\|p50\)"; }
show() { grep -E "output_tok_s|steps_s|step_time_share|mean_seqs|host_ms" "$1"; }
stamp engine_overlap
timeout 80 python3 -m veil.benchmarks.engine_throughput $w --paths engine --out "$OUT/engine_overlap.json" 2>&1 | keep > "$OUT/engine_overlap.txt"; show "$OUT/engine_overlap.txt"
stamp engine_no_overlap
timeout 80 python3 -m veil.benchmarks.engine_throughput $w --paths engine --no-overlap --out "$OUT/engine_no_overlap.json" 2>&1 | keep > "$OUT/engine_no_overlap.txt"; show "$OUT/engine_no_overlap.txt"
stamp reference
timeout 100 python3 -m veil.benchmarks.engine_throughput $w --paths reference --batch-size 256 --reference-dtypes bfloat16 --out "$OUT/reference.json" 2>&1 | keep > "$OUT/reference.txt"; show "$OUT/reference.txt"
stamp served
[ "$(el)" -lt 250 ] && timeout $(( 315 - $(el) )) python3 -m veil.benchmarks.engine_throughput $w --paths fast --out "$OUT/served.json" 2>&1 | keep > "$OUT/served.txt"; show "$OUT/served.txt"
stamp end
