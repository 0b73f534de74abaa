#!/bin/bash
# Issue 21: the compact evaluation-key set (baby steps chained from step 1 on the server).
# One tree, back to back under the machine's quiet lock: the four products under both key sets
# on SEAL and native, then the served k=2 path with the full set and with the compact set.
# flock /tmp/veil-quiet.lock bash benchmarks/results/2026-11-27-compact-keys/run.sh
# (each step below took the lock itself when it was run; the lock is not re-entrant)
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-11-27-compact-keys
PY=.venv/bin/python
$PY -m veil.benchmarks.protected_products --n1 16 --backends seal,native --keys full,compact --repeat 3 \
  --out $R/products.json > $R/products.txt 2>&1
for keys in full compact; do
  $PY -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
    --keys $keys --out $R/protected_overhead_$keys.json > $R/protected_overhead_$keys.txt 2>&1
done
# With be4ccde (warm-up outside the TTFT), the SDK's default key set, SEAL then native:
$PY -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
  --out $R/protected_overhead_auto_seal.json > $R/protected_overhead_auto_seal.txt 2>&1
$PY -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
  --he-backend native --out $R/protected_overhead_auto_native.json > $R/protected_overhead_auto_native.txt 2>&1
