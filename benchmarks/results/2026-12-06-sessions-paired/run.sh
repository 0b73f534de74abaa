# Runs 1 and 2 back to back at 46ebd85, run 3 at 4652a05, from the checkout (2-core EPYC VM, nothing else running):
for i in 1 2; do  # (run 3: the same command with run3)
  PYTHONSAFEPATH=1 python -m veil.benchmarks.protected_sessions --sessions 1,4 --modes batched,alone \
    --warmup 2 --steps 3 --out benchmarks/results/2026-12-06-sessions-paired/run$i.json \
    > benchmarks/results/2026-12-06-sessions-paired/run$i.txt 2>&1
done
