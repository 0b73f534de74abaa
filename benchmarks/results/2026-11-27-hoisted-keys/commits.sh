# Sourced by run.sh: a worktree per commit named in $commits, and `run <commit> <python args>`,
# which runs that commit's code through PYTHONPATH (/tmp/ab-<commit>/veil -> the worktree; the
# `veil serve` that protected_overhead starts inherits it).
py=/work/main/.venv/bin/python
here=$(pwd)
for c in $commits; do
  [ -d /tmp/wt-$c ] || git -C /work/main worktree add -f /tmp/wt-$c $c
  mkdir -p /tmp/ab-$c && ln -sfn /tmp/wt-$c /tmp/ab-$c/veil
done
run() { local c=$1; shift; (cd /tmp && PYTHONPATH=/tmp/ab-$c $py "$@"); }
