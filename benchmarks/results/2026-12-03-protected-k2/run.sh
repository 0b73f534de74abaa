#!/bin/bash
# The protected path end to end at k = 2 (28 protected layers), context 8, 4 new tokens, at this
# checkout, native then SEAL in one sitting (each client makes the key set its server names):
# the command of ../2026-11-29-folded-scores, to refresh the headline figures.
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-03-protected-k2
run() { echo "== $1 $(date -u +%T) $(git rev-parse --short HEAD)"; shift; "$@"; echo "rc=$? $(date -u +%T)"; }
for be in native seal; do
  run $be .venv/bin/python -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 \
      --max-new-tokens 4 --he-backend $be --out "$R/po_k2_ctx8_$be.json" > "$R/po_k2_ctx8_$be.txt" 2>&1
done
