# Issue 22's checks on the lent GPU (the fast path on CUDA). One call, carry [".gpukit"],
# timeout_s = BUDGET + 20 (BUDGET, default 400 s: the steps stop starting once it is spent),
# best on the machine issue19.sh left warm:
#   BUDGET=400 bash benchmarks/device/issue22.sh
# The CUDA-only tests (CUDA-graph replay = eager, the overlapped loop = the synchronous one); the
# 256-request workload (input and output lengths uniform in [100, 1024], EOS ignored) with the
# engine driven directly, with its overlapped loop (EngineConfig.overlap, never run on a GPU yet)
# and without; transformers bf16 `generate` in static batches of 256 in the same call; then
# `veil serve --device cuda` at concurrency 256, with the engine loop in the server's process and
# in its own (--engine-process; the served path's host ms per engine step). Last
# figures: ../results/2026-11-28-gpu/ (H100 22,717 output tok/s; H200 20,790 against 1,421.6).
BUDGET=${BUDGET:-400}
source benchmarks/device/setup.sh > "$OUT/setup.txt" 2>&1 || { cat "$OUT/setup.txt"; exit 1; }
tail -2 "$OUT/setup.txt"
git log --oneline -1 2>/dev/null | tee -a "$OUT/log.txt"
w="--device cuda --model /tmp/model --num-requests 256 --input-len 100,1024 --output-len 100,1024 --concurrency 256 --kv-cache-gb 40 --max-tokens-per-step 8192"
keep() { grep -v "it/s" | grep -v "figure .*\.\(p95\|p99\|p50\)"; }
show() { grep -E "output_tok_s|steps_s|step_time_share|mean_seqs|host_ms" "$1"; }
stamp tests
t=$(within 90) && VEIL_TEST_MODEL=/tmp/model timeout "$t" python3 -m pytest -q -p no:cacheprovider --tb=short \
  tests/test_fastpath.py tests/test_engine_overlap.py tests/test_engine_process.py -k cuda 2>&1 | tail -30 > "$OUT/tests.txt"; tail -4 "$OUT/tests.txt"
stamp engine_overlap
t=$(within 70) && timeout "$t" python3 -m veil.benchmarks.engine_throughput $w --paths engine --out "$OUT/engine_overlap.json" 2>&1 | keep > "$OUT/engine_overlap.txt"; show "$OUT/engine_overlap.txt"
stamp engine_no_overlap
t=$(within 70) && timeout "$t" python3 -m veil.benchmarks.engine_throughput $w --paths engine --no-overlap --out "$OUT/engine_no_overlap.json" 2>&1 | keep > "$OUT/engine_no_overlap.txt"; show "$OUT/engine_no_overlap.txt"
stamp reference  # ~100 s of generate at the 1.4k tok/s measured before
t=$(within 150) && timeout "$t" python3 -m veil.benchmarks.engine_throughput $w --paths reference --batch-size 256 --reference-dtypes bfloat16 --out "$OUT/reference.json" 2>&1 | keep > "$OUT/reference.txt"; show "$OUT/reference.txt"
stamp served  # in the server's process, then with --engine-process (engine/process.py: never run on a GPU yet)
t=$(within 150) && timeout "$t" python3 -m veil.benchmarks.engine_throughput $w --paths fast,fast-process --out "$OUT/served.json" 2>&1 | keep > "$OUT/served.txt"; show "$OUT/served.txt"
stamp end
