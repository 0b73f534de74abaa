# veil serve on asyncio + h11 (before = f7c4186) against uvloop + httptools (after = 13dac51):
# the tiny model (../2026-12-02-served/tiny_hf.py), 256 requests of issue 22's shape, at
# concurrency 256 (256 sequences per step) and 64, two rounds alternated. `bash run.sh` here;
# COMMITS="A B" runs two other commits the same way, into the current folder.
py=/work/main/.venv/bin/python
here=$(pwd)
served=$here/../2026-12-02-served  # tiny_hf.py, served.py
for c in ${COMMITS:-f7c4186 13dac51}; do
  [ -d /tmp/wt-$c ] || git -C /work/main worktree add -f --detach /tmp/wt-$c $c
  mkdir -p /tmp/ab-$c && ln -sfn /tmp/wt-$c /tmp/ab-$c/veil
done
[ -d /tmp/tinyhf ] || (cd $served && $py tiny_hf.py /tmp/tinyhf /tmp/wl_tiny.json)
for rep in 1 2; do
  for c in ${COMMITS:-f7c4186 13dac51}; do
    $py $served/served.py $here/c256_${c}_run$rep.json --server-path /tmp/ab-$c --model /tmp/tinyhf \
      --workload /tmp/wl_tiny.json --concurrency 256 --max-seqs 256 > $here/c256_${c}_run$rep.txt 2>&1
    $py $served/served.py $here/c64_${c}_run$rep.json --server-path /tmp/ab-$c --model /tmp/tinyhf \
      --workload /tmp/wl_tiny.json --concurrency 64 > $here/c64_${c}_run$rep.txt 2>&1
    date -u +"%H:%M:%S $c run$rep done" >> $here/times.txt
  done
done
