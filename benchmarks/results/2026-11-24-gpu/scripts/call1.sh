source .gpukit/setup.sh
t0=$(date +%s); stamp() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }
stamp tests
VEIL_TEST_MODEL=/tmp/model timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_native_cuda.py "tests/test_fastpath.py::test_cuda_graph_replay_equals_eager" 2>&1 | tail -15 | tee $OUT/tests.txt
stamp he_ops
timeout 150 python3 -m veil.benchmarks.he_ops --backends seal,native --device cuda --repeat 10 --out $OUT/he_ops_cuda.json 2>&1 | grep -v "it/s" | tee $OUT/he_ops_cuda.txt
stamp engine_throughput
timeout 200 python3 -m veil.benchmarks.engine_throughput --device cuda --model /tmp/model --paths engine,reference --num-requests 256 --input-len 100,1024 --output-len 100,1024 --concurrency 256 --batch-size 64 --reference-dtypes bfloat16 --kv-cache-gb 40 --max-tokens-per-step 2048 --out $OUT/engine_throughput_cuda.json 2>&1 | grep -v "it/s" | tail -60 | tee $OUT/engine_throughput_cuda.txt
stamp protected_bench
timeout 150 python3 -m veil.benchmarks.protected_bench --he-backend native --device cuda --model /tmp/model --contexts 16,64 --out $OUT/protected_bench_native_cuda.json 2>&1 | grep -v "it/s" | tee $OUT/protected_bench_native_cuda.txt
stamp end
