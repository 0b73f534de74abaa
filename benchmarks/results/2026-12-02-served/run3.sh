# The engine loop's host time per step when serving, with and without the mailbox and the
# coalesced chunks: before = c9db457 with f482340's host-seconds metric cherry-picked (14e14c5,
# a measurement-only commit in a worktree, not on main), after = f482340. Tiny model, 256
# requests at concurrency 256, 256 sequences per step, two rounds alternated.
py=/work/main/.venv/bin/python
here=$(pwd)
# before: c9db457 with f482340's metric (its server/ changes only), built here as 14e14c5 was
if [ ! -d /tmp/wt-before-mb ]; then
  git -C /work/main worktree add -f --detach /tmp/wt-before-mb c9db457
  git -C /work/main diff f482340~1 f482340 -- server/ | git -C /tmp/wt-before-mb apply
fi
[ -d /tmp/wt-after-mb ] || git -C /work/main worktree add -f --detach /tmp/wt-after-mb f482340
mkdir -p /tmp/ab-before-mb /tmp/ab-after-mb
ln -sfn /tmp/wt-before-mb /tmp/ab-before-mb/veil; ln -sfn /tmp/wt-after-mb /tmp/ab-after-mb/veil
[ -d /tmp/tinyhf ] || $py tiny_hf.py /tmp/tinyhf /tmp/wl_tiny.json
for rep in 1 2; do
  for c in before-mb after-mb; do
    $py served.py $here/host_c256_${c}_run$rep.json --server-path /tmp/ab-$c --model /tmp/tinyhf \
      --workload /tmp/wl_tiny.json --concurrency 256 --max-seqs 256 > $here/host_c256_${c}_run$rep.txt 2>&1
  done
done
