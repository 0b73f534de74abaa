source .gpukit/setup.sh
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; stamp() { echo "== $1 at $(el) s"; }
stamp cuda_graph_test
TRITON_INTERPRET=0 VEIL_TEST_MODEL=/tmp/model timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_fastpath.py -k cuda_graph 2>&1 | tail -25 | tee $OUT/tests3.txt
stamp protected_bench_seal_on_device_cpu
timeout 300 python3 -m veil.benchmarks.protected_bench --he-backend seal --model /tmp/model --contexts 16,64 --out $OUT/protected_bench_seal_devcpu.json 2>&1 | grep -v "it/s" | tee $OUT/protected_bench_seal_devcpu.txt
stamp end
