#!/usr/bin/env bash
# A prefill span's products, one position after another vs the span's positions as the rows of
# one batch under the session's keys (native backend, CPU). Run from this folder, quiet machine:
#   flock /tmp/veil-quiet.lock bash run.sh
set -euo pipefail
py=../../../.venv/bin/python
$py -m veil.benchmarks.protected_products --n1 16 --backends native --positions 8 --repeat 3 \
    --out products_native_positions8.json 2>&1 | grep -v "Converting\|Loading" | tee products_native_positions8.txt
