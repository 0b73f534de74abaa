#!/usr/bin/env bash
# Packed products (several positions per ciphertext), per position, against one position per
# ciphertext. Run from the repository root, nothing else running:
#   flock /tmp/veil-quiet.lock bash benchmarks/results/2026-11-27-packed-products/run.sh
set -euo pipefail
D=benchmarks/results/2026-11-27-packed-products
python -m veil.benchmarks.protected_products --n1 16 --backends native --pack 1,2,4 --repeat 5 \
  --out $D/native-pack.json > $D/native-pack.txt
python -m veil.benchmarks.protected_products --n1 16,24 --backends native,seal --pack 1,2,4 --repeat 5 \
  --out $D/native-seal-pack.json > $D/native-seal-pack.txt
