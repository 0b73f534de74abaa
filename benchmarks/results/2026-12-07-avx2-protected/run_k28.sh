#!/bin/bash
# The protected path served end to end on this CPU (no AVX-512), the AVX2 lanes against the
# scalar loops (VEIL_CPU_AVX2=0, inherited by the benchmark's veil serve subprocess): k=28, an
# 8-token prompt, 6 new tokens, native backend, alternating, two rounds.
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-07-avx2-protected
export PYTHONSAFEPATH=1
for round in 1 2; do
    for avx2 in 0 1; do
        echo "== round $round VEIL_CPU_AVX2=$avx2 $(date -u +%T)"
        VEIL_CPU_AVX2=$avx2 .venv/bin/python -m veil.benchmarks.protected_overhead --paths protected --k 28 \
            --contexts 8 --max-new-tokens 6 --he-backend native --out "$R/k28_avx2${avx2}_$round.json" 2>&1 \
            | grep -E "^figure protected\.(tpot_s\.mean|ttft_s|kl|greedy|client_cpu|server_s)" | head -40
    done
done > "$R/k28.txt"
