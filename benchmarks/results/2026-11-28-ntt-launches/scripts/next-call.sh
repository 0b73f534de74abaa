# Superseded (2026-12-02) by ../../../device/issue19.sh and issue22.sh, which build on kit.sh; kept as the record.
# The next device session's first call (not run yet: no device on 2026-11-28's second session).
# Run with the kind nvidia-h100-x1, so its figures compare with ../../2026-11-28-gpu/call1-h100
# (the code before these launch cuts, same kind), carry [".gpukit"] (../../2026-11-24-gpu/scripts/setup.sh
# and the wheels), timeout_s 480:
#   bash benchmarks/results/2026-11-28-ntt-launches/scripts/next-call.sh
# then next-call-engine.sh (issue 22) as the second call. 2026-11-29: the kind lent is nvidia-h200.
source .gpukit/setup.sh > /tmp/setup.txt 2>&1; tail -3 /tmp/setup.txt
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; stamp() { echo "== $1 at $(el) s" | tee -a $OUT/log.txt; }
git log --oneline -1 2>/dev/null | tee -a $OUT/log.txt; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/log.txt
stamp tests  # every kernel and whole operation on CUDA = the CPU, bit for bit
TRITON_INTERPRET=0 VEIL_TEST_MODEL=/tmp/model timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_native_cuda.py tests/test_rounding.py 2>&1 | tail -40 > $OUT/tests.txt; tail -8 $OUT/tests.txt
stamp he_ops  # call1-h100: rotate 5.30 ms, 16 hoisted 8.82, ct x ct + relin 6.74, rescale 2.08, NTT 1.10
timeout 90 python3 -m veil.benchmarks.he_ops --backends native --device cuda --repeat 5 2>&1 | grep -v "it/s" > $OUT/he_ops.txt; tail -20 $OUT/he_ops.txt
stamp protected_bench  # the H200 read 0.552 / 0.854 s per layer at contexts 16 / 64
timeout 120 python3 -m veil.benchmarks.protected_bench --he-backend native --device cuda --model /tmp/model --contexts 16,64 --out $OUT/pb.json 2>&1 | grep -v "it/s" > $OUT/pb.txt; grep -E "layer_server_s|tpot_s.extra|peak|rel_err" $OUT/pb.txt
stamp protected_sessions  # call1-h100: TPOT 1.40 / 2.99 / 5.07 s, aggregate 0.713 / 1.339 / 3.158 tok/s
[ $(el) -lt 300 ] && timeout $(( 450 - $(el) )) python3 -m veil.benchmarks.protected_sessions --device cuda --model /tmp/model --sessions 1,4,16 --warmup --out $OUT/ps.json 2>&1 | grep -v "it/s" > $OUT/ps.txt; grep -E "tpot|aggregate|server_s\.s|equal|peak" $OUT/ps.txt
stamp end
