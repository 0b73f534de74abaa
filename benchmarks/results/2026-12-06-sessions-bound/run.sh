# What batching sessions can share on this CPU: protected_sessions at 1, 2 and 4 sessions with
# the server on one thread and on two (torch's and the C kernels' OpenMP team), two rounds,
# alternating. Run from the checkout with its .venv: bash benchmarks/results/2026-12-06-sessions-bound/run.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
export PYTHONSAFEPATH=1
for rep in 1 2; do
  for t in 1 2; do
    OMP_NUM_THREADS=$t .venv/bin/python -m veil.benchmarks.protected_sessions --sessions 1,2,4 --warmup 2 \
      --out "$here/ps_t${t}_run$rep.json" 2>&1 | grep -v -E "it/s|^Loading" > "$here/ps_t${t}_run$rep.txt"
    date -u +"%H:%M:%S threads $t round $rep done" >> "$here/times.txt"
  done
done
