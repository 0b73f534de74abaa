# A level-0 download's preparation, whole and folded, and the client's decryption of the folded one
# (he_ops measures them since 7924fe2; median of 20):
#   cd benchmarks/results/2026-11-28-folded-mlp && flock /tmp/veil-quiet.lock bash run_ops.sh
cd /work/main && .venv/bin/python -m veil.benchmarks.he_ops --backends seal,native --repeat 20 \
  --out benchmarks/results/2026-11-28-folded-mlp/he_ops.json > benchmarks/results/2026-11-28-folded-mlp/he_ops.txt 2>&1
