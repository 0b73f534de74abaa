#!/bin/bash
# Additions in one C pass and the NTT of a limb run read in place (4378fbd) against the commit
# before (3216f66): the two operations alone, the profile of a middle layer's server work, and
# protected_bench --contexts 16 three rounds alternating (../2026-11-27-rotations/commits.sh).
cd "$(dirname "$0")"
stamp() { echo "== $1 $(date -u +%T)"; }
py=/work/main/.venv/bin/python
stamp add_micro; $py add_micro.py > add_micro.txt 2>&1
stamp ntt_view; $py ntt_view.py > ntt_view.txt 2>&1
commits="3216f66 4378fbd"
source ../2026-11-27-rotations/commits.sh
for c in $commits; do stamp steady_$c; run $c $here/steady.py 2 > steady_$c.txt 2>&1; done
stamp bench_rounds; bench_rounds native; stamp end
