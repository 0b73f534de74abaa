source .gpukit/setup.sh > /tmp/setup.txt 2>&1; tail -3 /tmp/setup.txt
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; stamp() { echo "== $1 at $(el) s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/log.txt
stamp protected_bench
timeout 130 python3 -m veil.benchmarks.protected_bench --he-backend native --device cuda --model /tmp/model --contexts 16,64 --out $OUT/pb.json 2>&1 | grep -v "it/s" > $OUT/pb.txt; grep -E "layer_server_s\.ctx|rotations_per_layer|tpot_s.extra|peak|rel_err|wall" $OUT/pb.txt
stamp engine_reference
timeout $(( 345 - $(el) )) python3 -m veil.benchmarks.engine_throughput --device cuda --model /tmp/model --paths engine,reference --num-requests 256 --input-len 100,1024 --output-len 100,1024 --concurrency 256 --batch-size 256 --reference-dtypes bfloat16 --kv-cache-gb 40 --max-tokens-per-step 8192 --out $OUT/engine_reference.json 2>&1 | grep -v "it/s" | grep -v "figure .*\.\(p95\|p99\|p50\)" > $OUT/engine_reference.txt; grep -E "tok/s|output_tok_s|steps_s|step_time_share|mean_seqs" $OUT/engine_reference.txt
stamp end
