# cd benchmarks/results/2026-11-28-speculation-native && flock /tmp/veil-quiet.lock bash run.sh
# (speculation_28d0fda.*: the same command at 00:46 UTC on 28d0fda plus the benchmark's --he-backend flag)
cd /work/main
.venv/bin/python -m veil.benchmarks.speculation --k 28 --speculate 4 --max-new-tokens 16 --he-backend native \
  --out benchmarks/results/2026-11-28-speculation-native/speculation.json \
  > benchmarks/results/2026-11-28-speculation-native/speculation.txt 2>&1
