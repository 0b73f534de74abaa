# The engine loop's host time per step when serving, with and without the mailbox and the
# coalesced chunks: before = c9db457 with f482340's host-seconds metric cherry-picked (14e14c5,
# a measurement-only commit in a worktree, not on main), after = f482340. Tiny model, 256
# requests at concurrency 256, 256 sequences per step, two rounds alternated.
py=/work/main/.venv/bin/python
here=$(pwd)
[ -d /tmp/tinyhf ] || $py tiny_hf.py /tmp/tinyhf /tmp/wl_tiny.json
for rep in 1 2; do
  for c in before-mb after-mb; do
    $py served.py $here/host_c256_${c}_run$rep.json --server-path /tmp/ab-$c --model /tmp/tinyhf \
      --workload /tmp/wl_tiny.json --concurrency 256 --max-seqs 256 > $here/host_c256_${c}_run$rep.txt 2>&1
  done
done
