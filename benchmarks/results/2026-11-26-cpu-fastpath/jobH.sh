#!/bin/bash
cd /work/main
ET=".venv/bin/python -m veil.benchmarks.engine_throughput --paths engine --dtype bfloat16"
echo "== t2_passive $(date -u +%T)"; OMP_WAIT_POLICY=PASSIVE $ET --engine-threads 2 --out /tmp/t2p.json; echo "rc=$?"
echo "== t2_again $(date -u +%T)"; $ET --engine-threads 2 --out /tmp/t2b.json; echo "rc=$?"
echo "== t1_again $(date -u +%T)"; $ET --engine-threads 1 --out /tmp/t1b.json; echo "rc=$? $(date -u +%T)"
