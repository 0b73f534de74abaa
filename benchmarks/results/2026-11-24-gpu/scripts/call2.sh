source .gpukit/setup.sh
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; stamp() { echo "== $1 at $(el) s"; }
stamp cuda_graph_test
TRITON_INTERPRET=0 VEIL_TEST_MODEL=/tmp/model timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=native tests/test_fastpath.py tests/test_native_cuda.py 2>&1 | tail -25 | tee $OUT/tests2.txt
stamp he_ops
timeout 120 python3 -m veil.benchmarks.he_ops --backends seal,native --device cuda --repeat 10 --out $OUT/he_ops_cuda.json 2>&1 | grep -v "it/s" | tee $OUT/he_ops_cuda.txt
stamp engine_reference
timeout 200 python3 -m veil.benchmarks.engine_throughput --device cuda --model /tmp/model --paths engine,reference --num-requests 256 --input-len 100,1024 --output-len 100,1024 --concurrency 256 --batch-size 256 --reference-dtypes bfloat16 --kv-cache-gb 40 --max-tokens-per-step 2048 --out $OUT/engine_throughput_cuda.json 2>&1 | grep -v "it/s" | grep -v "figure .*\.\(p95\|p99\|p50\)" | tee $OUT/engine_throughput_cuda.txt
stamp he_ops_compile
[ $(el) -lt 400 ] && timeout $(( 560 - $(el) )) python3 -m veil.benchmarks.he_ops --backends native --device cuda --compile --repeat 10 --out $OUT/he_ops_cuda_compile.json 2>&1 | grep -v "it/s" | tail -30 | tee $OUT/he_ops_cuda_compile.txt
stamp end
