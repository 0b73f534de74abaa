# Before (aa4831d) and after (465e88a) the residues' bit-packing in C, on the 2-core VM, under
# `flock /tmp/veil-quiet.lock bash run.sh` with nothing beside it.
commits="aa4831d 465e88a"
source ../2026-11-27-rotations/commits.sh
for c in $commits; do
  run $c -m veil.benchmarks.he_ops --backends native,seal --repeat 9 --out $here/he_ops_$c.json > $here/he_ops_$c.txt 2>&1
done
date -u +"%H:%M:%S he_ops done" >> $here/times.txt
bench_rounds native
date -u +"%H:%M:%S bench_rounds done" >> $here/times.txt
overhead_pair native
