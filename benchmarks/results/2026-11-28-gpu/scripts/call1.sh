source .gpukit/setup.sh > /tmp/setup.txt 2>&1; tail -3 /tmp/setup.txt
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; stamp() { echo "== $1 at $(el) s" | tee -a $OUT/log.txt; }
git log --oneline -1 2>/dev/null | tee -a $OUT/log.txt; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/log.txt; lscpu | grep -E "Model name|^CPU\(s\)" | tee -a $OUT/log.txt
stamp tests
TRITON_INTERPRET=0 VEIL_TEST_MODEL=/tmp/model timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_native_cuda.py tests/test_fastpath.py tests/test_wide.py tests/test_rounding.py 2>&1 | tail -60 > $OUT/tests.txt; tail -12 $OUT/tests.txt
stamp protected_bench
timeout 120 python3 -m veil.benchmarks.protected_bench --he-backend native --device cuda --model /tmp/model --contexts 64 --out $OUT/pb.json 2>&1 | grep -v "it/s" > $OUT/pb.txt; grep -E "layer_server_s\.ctx|rotations_per_layer|tpot_s.extra|peak|rel_err|bytes_per_token" $OUT/pb.txt
stamp protected_sessions
[ $(el) -lt 260 ] && timeout $(( 385 - $(el) )) python3 -m veil.benchmarks.protected_sessions --device cuda --model /tmp/model --sessions 1,4,16 --warmup --out $OUT/ps.json 2>&1 | grep -v "it/s" > $OUT/ps.txt; grep -E "tpot|aggregate|server_s\.s|equal|peak|client_s" $OUT/ps.txt
stamp he_ops
[ $(el) -lt 375 ] && timeout $(( 420 - $(el) )) python3 -m veil.benchmarks.he_ops --backends native --device cuda --repeat 5 2>&1 | grep -v "it/s" > $OUT/he_ops.txt; tail -20 $OUT/he_ops.txt
stamp end
