# 64 split sessions for 300 s against `veil serve` (k=2, 1 GB KV pool), without and then with about
# one step in 4 preceded by a message a client should not send. Run from the checkout with its
# .venv: bash benchmarks/results/2026-12-06-bad-soak/run.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
export PYTHONSAFEPATH=1
git rev-parse --short HEAD > "$here/commit.txt"
for bad in 0 4; do
  date -u +"%H:%M:%S bad-every $bad start" >> "$here/times.txt"
  .venv/bin/python -m veil.benchmarks.load_soak --sessions 64 --duration 300 --bad-every $bad \
    --out "$here/soak_bad$bad.json" > "$here/soak_bad$bad.txt" 2>&1
  date -u +"%H:%M:%S bad-every $bad done (rc $?)" >> "$here/times.txt"
done
