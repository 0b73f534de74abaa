# The mailbox and the coalesced chunks (after: the commit that added this script) against
# c9db457: the tiny model at concurrency 64 and, with 256 sequences per step, 256; two rounds.
commits="c9db457 $1"
source ../2026-11-27-rotations/commits.sh
[ -d /tmp/tinyhf ] || $py tiny_hf.py /tmp/tinyhf /tmp/wl_tiny.json
for rep in 1 2; do
  for c in $commits; do
    $py served.py $here/mb_c64_${c}_run$rep.json --server-path /tmp/ab-$c --model /tmp/tinyhf \
      --workload /tmp/wl_tiny.json --concurrency 64 > $here/mb_c64_${c}_run$rep.txt 2>&1
    $py served.py $here/mb_c256_${c}_run$rep.json --server-path /tmp/ab-$c --model /tmp/tinyhf \
      --workload /tmp/wl_tiny.json --concurrency 256 --max-seqs 256 > $here/mb_c256_${c}_run$rep.txt 2>&1
  done
done
