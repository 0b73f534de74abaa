source .gpukit/setup.sh
mkdir -p /tmp/nsb/veil; for d in client server crypto protected engine kernels cli benchmarks cluster; do ln -sfn "$PWD/.gpukit/before/$d" /tmp/nsb/veil/$d; done
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; stamp() { echo "== $1 at $(el) s"; }
stamp tests
TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_native_cuda.py tests/test_wide.py tests/test_rounding.py 2>&1 | tail -30 > $OUT/tests.txt; tail -8 $OUT/tests.txt
PS="-m veil.benchmarks.protected_sessions --device cuda --model /tmp/model --sessions 1,4,16 --warmup"
stamp sessions_after
timeout 200 python3 $PS --out $OUT/ps_after.json 2>&1 | grep -v "it/s" > $OUT/ps_after.txt; grep -E "tpot|aggregate|shuffle|serialization|equal|peak|server_s.s|client_s" $OUT/ps_after.txt
stamp sessions_before
[ $(el) -lt 300 ] && PYTHONPATH=/tmp/nsb:/tmp/site timeout 200 python3 $PS --out $OUT/ps_before.json 2>&1 | grep -v "it/s" > $OUT/ps_before.txt; grep -E "tpot|aggregate|shuffle|serialization|equal|server_s.s|client_s" $OUT/ps_before.txt
stamp protected_bench
[ $(el) -lt 420 ] && timeout $(( 500 - $(el) )) python3 -m veil.benchmarks.protected_bench --he-backend native --device cuda --model /tmp/model --contexts 16,64 --out $OUT/protected_bench_cuda.json 2>&1 | grep -v "it/s" > $OUT/protected_bench_cuda.txt; tail -30 $OUT/protected_bench_cuda.txt
stamp end
