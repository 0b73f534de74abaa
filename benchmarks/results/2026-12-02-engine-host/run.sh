# A/B of the engine loop's host work: 0987d69 (before) and 45a4de2 (after), alternated, the
# tiny model three rounds each, then the shipped model once each (smaller lengths).
commits="0987d69 45a4de2"
source ../2026-11-27-rotations/commits.sh
for rep in 1 2 3; do
  for c in $commits; do
    run $c $here/phases.py > $here/tiny_${c}_run$rep.txt 2>&1
  done
done
for c in $commits; do
  run $c $here/phases.py --model shipped --lens 16,64 > $here/shipped_${c}.txt 2>&1
done
