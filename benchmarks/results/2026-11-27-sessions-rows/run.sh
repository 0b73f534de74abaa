#!/bin/bash
# Issue 19: sessions batched on the CPU after the C multiply-accumulate reads per-row plaintexts.
# flock /tmp/veil-quiet.lock bash benchmarks/results/2026-11-27-sessions-rows/run.sh
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-11-27-sessions-rows
echo "start $(date -u +%T)"
.venv/bin/python -m veil.benchmarks.protected_sessions --sessions 1,4 --warmup --out $R/protected_sessions.json > $R/protected_sessions.txt 2>&1
echo "rc=$? end $(date -u +%T)"
