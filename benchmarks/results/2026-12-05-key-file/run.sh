#!/usr/bin/env bash
# A protected `veil chat` started three times against one `veil serve` (native, k=28, loopback,
# the 2-core VM): without a key file, with a new key file (keys made and written), with that key
# file again (nothing made, nothing uploaded). Each run: one prompt, 2 new tokens. Wall time per
# process by `date`, the CLI's own stats line, and the server's bytes in on /v1/keys.
# Usage (from the repository root): bash benchmarks/results/2026-12-05-key-file/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
V=.venv/bin/veil
work=$(mktemp -d)
trap 'kill $srv 2>/dev/null || true; rm -rf "$work"' EXIT
key=$($V tenants add bench --scope protected --file "$work/tenants.json" | tail -1 | awk '{print $NF}')
$V serve --tenants "$work/tenants.json" --k 28 --he-backend native --protected-warmup --port 8471 \
    > "$work/serve.log" 2>&1 &
srv=$!
until curl -sf http://127.0.0.1:8471/health | grep -q '"ready": *true'; do sleep 2; done
setup_in() { curl -s http://127.0.0.1:8471/metrics | awk '/^veil_bytes_in_total\{path="protected_setup"\}/ {print $2}'; }
chat() {  # label, then extra flags
  local label=$1; shift
  local before t0 t1
  before=$(setup_in); t0=$(date +%s.%N)
  $V chat --server http://127.0.0.1:8471 --api-key "$key" --mode protected --k 28 --max-new-tokens 2 \
      --prompt "What is the capital of France?" "$@" 2>&1 | grep -v "it/s\|CKKS keys" | tail -2
  t1=$(date +%s.%N)
  # awk, not bc: the exporter writes large counters in exponent form (1.79494477e+08)
  awk -v l="$label" -v a="$t0" -v b="$t1" -v x="${before:-0}" -v y="$(setup_in)" \
      'BEGIN { printf "figure key_file.%s.process_s %.2f\nfigure key_file.%s.setup_bytes_in %.0f\n", l, b - a, l, (y == "" ? 0 : y) - x }'
}
chat no_key_file
chat new_key_file --key-file "$work/keys"
ls -l "$work/keys" | awk '{print "key file:", $1, $5, "bytes"}'
chat key_file_again --key-file "$work/keys"
# the keys alone, in one process: made (as a client without a key file does) vs read from the file
.venv/bin/python - "$key" "$work/keys" <<'PY'
import sys, time
from veil.client.sdk import VeilClient
for label, path in (("make", None), ("load", sys.argv[2])):
    c = VeilClient("http://127.0.0.1:8471", sys.argv[1], mode="protected", k=28, key_file=path)
    t = time.perf_counter(); c.generate_keys(progress=False)
    print(f"figure key_file.keys_{label}_s {time.perf_counter() - t:.2f}")
PY
