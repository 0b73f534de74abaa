source .gpukit/setup.sh
t0=$(date +%s); echo "== sessions_synced at 0 s"
timeout 180 python3 -m veil.benchmarks.protected_sessions --device cuda --model /tmp/model --sessions 1,4,16 --warmup --out $OUT/ps_synced.json 2>&1 | grep -v "it/s" | tee $OUT/ps_synced.txt | grep -E "tpot|aggregate|server_s|equal"
echo "== end at $(( $(date +%s) - t0 )) s"
