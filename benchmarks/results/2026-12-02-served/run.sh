# The served fast path before (d09a2e6) and after (c9db457) this session's serving changes: only
# the server's code differs (served.py's load generator is this checkout's). Two rounds on the
# tiny random model at concurrency 64 (the old server's cap is 64 sequences per step), then the
# must-show workload on the shipped model (64 requests, concurrency 16). One server thread, the
# load generator on the other core.
commits="d09a2e6 c9db457"
source ../2026-11-27-rotations/commits.sh
$py tiny_hf.py /tmp/tinyhf /tmp/wl_tiny.json
for rep in 1 2; do
  for c in $commits; do
    $py served.py $here/tiny_c64_${c}_run$rep.json --server-path /tmp/ab-$c --model /tmp/tinyhf \
      --workload /tmp/wl_tiny.json --concurrency 64 > $here/tiny_c64_${c}_run$rep.txt 2>&1
  done
done
for c in $commits; do
  $py served.py $here/shipped_c16_$c.json --server-path /tmp/ab-$c --concurrency 16 > $here/shipped_c16_$c.txt 2>&1
done
