# Sourced by run.sh and run2.sh (and later folders' scripts): a worktree per commit named in
# $commits, and `run <commit> <python args>`, which runs that commit's code through PYTHONPATH
# (/tmp/ab-<commit>/veil -> the worktree; the `veil serve` that protected_overhead starts inherits it).
py=/work/main/.venv/bin/python
here=$(pwd)
for c in $commits; do
  [ -d /tmp/wt-$c ] || git -C /work/main worktree add -f /tmp/wt-$c $c
  mkdir -p /tmp/ab-$c && ln -sfn /tmp/wt-$c /tmp/ab-$c/veil
done
run() { local c=$1; shift; (cd /tmp && PYTHONPATH=/tmp/ab-$c $py "$@"); }

# `overhead_pair <backend>`: protected_overhead at k = 2, context 8, 4 new tokens, each commit in
# turn, into po_k2_ctx8_<backend>_<commit>.{txt,json} here (times.txt: when each ended).
overhead_pair() {
  local be=$1 c
  for c in $commits; do
    run $c -m veil.benchmarks.protected_overhead --paths protected --k 2 --contexts 8 --max-new-tokens 4 \
      --he-backend $be --out $here/po_k2_ctx8_${be}_$c.json > $here/po_k2_ctx8_${be}_$c.txt 2>&1
    date -u +"%H:%M:%S $c $be done" >> $here/times.txt
  done
}

# `bench_rounds <backend>`: protected_bench --contexts 16 (two layers, the refresh between them),
# three rounds alternating the commits, into pb_ctx16_<backend>_<commit>_run<n>.txt here.
bench_rounds() {
  local be=$1 rep c
  for rep in 1 2 3; do
    for c in $commits; do
      run $c -m veil.benchmarks.protected_bench --contexts 16 --he-backend $be > $here/pb_ctx16_${be}_${c}_run$rep.txt 2>&1
    done
  done
}
