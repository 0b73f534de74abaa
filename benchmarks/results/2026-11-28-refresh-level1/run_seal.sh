# The same on SEAL, in the order they ran: the two-layer error, then the k = 2 end-to-end pair:
#   cd benchmarks/results/2026-11-28-refresh-level1 && flock /tmp/veil-quiet.lock bash run_seal.sh
bash run_bench.sh seal && bash run.sh seal
