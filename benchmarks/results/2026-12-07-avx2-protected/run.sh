#!/bin/bash
# The AVX2 lanes of the native backend's CPU kernels (the NTT of every prime, the
# multiply-accumulate) against the scalar loops (VEIL_CPU_AVX2=0) on a CPU without AVX-512: the
# transform per row and the multiply-accumulate's rate, then protected_bench's two-layer step
# (native, context 16), alternating, three rounds. Nothing else should run beside it.
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-07-avx2-protected
export PYTHONSAFEPATH=1
for avx2 in 0 1; do
    echo "== ntt_rows, mac_rate VEIL_CPU_AVX2=$avx2 $(date -u +%T)"
    VEIL_CPU_AVX2=$avx2 .venv/bin/python "$R/ntt_rows.py"
    VEIL_CPU_AVX2=$avx2 .venv/bin/python "$R/mac_rate.py"
done > "$R/kernel_rates.txt" 2>&1
for round in 1 2 3; do
    for avx2 in 0 1; do
        echo "== round $round VEIL_CPU_AVX2=$avx2 $(date -u +%T)"
        VEIL_CPU_AVX2=$avx2 .venv/bin/python -m veil.benchmarks.protected_bench --he-backend native --contexts 16 \
            --out "$R/ab_avx2${avx2}_$round.json" 2>&1 | grep -E "^figure protected.native.(layer_server_s|two_layer|tpot)"
    done
done > "$R/ab.txt"
