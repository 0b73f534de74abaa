# TTFT for a 64-token prompt and TPOT at context 64, k = 2, native backend (full key set), with the
# scores download folded (d735da7), under the quiet lock:
#   cd benchmarks/results/2026-11-29-ttft64-native && flock /tmp/veil-quiet.lock bash run.sh
/work/main/.venv/bin/python -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 64 \
  --max-new-tokens 2 --he-backend native --out po_k2_ctx64_native_d735da7.json > po_k2_ctx64_native_d735da7.txt 2>&1
date -u +"%H:%M:%S done" >> times.txt
