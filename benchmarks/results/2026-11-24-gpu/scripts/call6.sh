source .gpukit/setup.sh
for m in 2048 8192 16384; do
  echo "== max-tokens-per-step $m"
  timeout 120 python3 -m veil.benchmarks.engine_throughput --device cuda --model /tmp/model --paths engine --num-requests 256 --input-len 100,1024 --output-len 100,1024 --concurrency 256 --kv-cache-gb 40 --max-tokens-per-step $m --out $OUT/engine_throughput_cuda_mt$m.json 2>&1 | grep -E "output tok/s|figure engine\.(output_tok_s|steps|steps_s|mean_seqs_per_step|step_time_share|decode_only_steps|ttft_s.mean|tpot_s.mean)\." 
done
