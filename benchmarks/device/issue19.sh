# Issue 19's checks on the lent GPU (the protected blocks on CUDA). One call, carry [".gpukit"],
# timeout_s = BUDGET + 20 (BUDGET, default 380 s: the steps stop starting once it is spent):
#   BUDGET=380 bash benchmarks/device/issue19.sh
# Prints what the issue asks for: the CUDA tests, he_ops --device cuda, the k=2 server time per
# token (protected_bench extrapolates 28 layers from two; its --profile step says how much of the
# server's host time the GPU spends computing, and how many kernels it launches), and sessions 1/4/16 with TPOT,
# aggregate tok/s, server time by operation and device memory; files land in $OUT. Last figures
# to compare with: ../results/2026-11-28-gpu/ (H100: rotate 5.30 ms, 16 hoisted 8.82, ct x ct +
# relin 6.74; a layer 0.552 / 0.854 s at contexts 16 / 64 on the H200; sessions TPOT 1.40 / 2.99
# / 5.07 s on the H100). Since then, counted on the CPU: a layer 1,144 Triton launches and 2,279
# torch ops (../results/2026-12-06-cuda-ops/), against ~6,800 launches then; host syncs 19 -> 3 per
# layer (../results/2026-12-07-host-syncs/). The 2026-11-28 figures waited for the device at every
# op kind's boundary; now the timed steps do not, and one more step per context / session count
# (--split-round, on by default on CUDA) gives the split by kind and the *.synced totals.
# CUDA graphs of the key switches and rescales (crypto/native/graphs.py, VEIL_NATIVE_CUDA_GRAPHS=1,
# off by default until this call measures them): their tests, he_ops' native_graphs run (checked
# bit-identical to eager there) and protected_bench at context 16 with them, beside the eager run;
# last, where the budget leaves time, the same with whole products graphed too
# (VEIL_NATIVE_CUDA_GRAPHS=products; tests/test_native_graphs.py's product test runs above).
BUDGET=${BUDGET:-400}
source benchmarks/device/setup.sh > "$OUT/setup.txt" 2>&1 || { cat "$OUT/setup.txt"; exit 1; }
tail -2 "$OUT/setup.txt"
git log --oneline -1 2>/dev/null | tee -a "$OUT/log.txt"
keep() { grep -v "it/s"; }
stamp tests  # every CKKS kernel and whole operation on CUDA = the CPU path, bit for bit
t=$(within 150) && VEIL_TEST_MODEL=/tmp/model timeout "$t" python3 -m pytest -q -p no:cacheprovider --tb=short \
  tests/test_native_cuda.py tests/test_native_graphs.py tests/test_rounding.py \
  "tests/test_bench_smoke.py::test_host_device_counts_the_kernels_launched_in_the_ranges_on_cuda" \
  2>&1 | tail -40 > "$OUT/tests.txt"; tail -6 "$OUT/tests.txt"
stamp he_ops
t=$(within 90) && timeout "$t" python3 -m veil.benchmarks.he_ops --backends native --device cuda --repeat 5 \
  --cuda-graphs --out "$OUT/he_ops.json" 2>&1 | keep > "$OUT/he_ops.txt"; grep -E "^figure|differs" "$OUT/he_ops.txt" | head -40
stamp protected_bench  # k=2: server seconds per token, extrapolated from layers 10-11; then, profiled
# (--profile, host_device.py), how much of the server's host time the GPU computes, and its launches
t=$(within 110) && timeout "$t" python3 -m veil.benchmarks.protected_bench --he-backend native --device cuda \
  --model /tmp/model --contexts 16,64 --profile --out "$OUT/pb.json" 2>&1 | keep > "$OUT/pb.txt"
grep -E "layer_server_s|tpot_s|peak|rel_err|profile" "$OUT/pb.txt"  # layer_server_s.synced: the split step
stamp protected_bench_graphs  # the same step, its key switches and rescales replayed from CUDA graphs
t=$(within 70) && VEIL_NATIVE_CUDA_GRAPHS=1 timeout "$t" python3 -m veil.benchmarks.protected_bench --he-backend native \
  --device cuda --model /tmp/model --contexts 16 --out "$OUT/pb_graphs.json" 2>&1 | keep > "$OUT/pb_graphs.txt"
grep -E "layer_server_s|tpot_s|peak|rel_err|graph" "$OUT/pb_graphs.txt"
stamp protected_sessions
t=$(within 200) && timeout "$t" python3 -m veil.benchmarks.protected_sessions --device cuda --model /tmp/model \
  --sessions 1,4,16 --warmup --out "$OUT/ps.json" 2>&1 | keep > "$OUT/ps.txt"
grep -E "tpot|aggregate|server_s|equal|peak" "$OUT/ps.txt"
stamp protected_bench_products  # if time is left: whole products replayed from CUDA graphs too
t=$(within 70) && VEIL_NATIVE_CUDA_GRAPHS=products timeout "$t" python3 -m veil.benchmarks.protected_bench \
  --he-backend native --device cuda --model /tmp/model --contexts 16 --out "$OUT/pb_products.json" 2>&1 \
  | keep > "$OUT/pb_products.txt"
grep -E "layer_server_s|tpot_s|peak|rel_err|graph" "$OUT/pb_products.txt"
stamp end
