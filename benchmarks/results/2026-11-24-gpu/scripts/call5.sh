source .gpukit/setup.sh
for b in 64 128 256; do
  echo "== batch $b"
  timeout 150 python3 -m veil.benchmarks.step_profile --device cuda --dtype bfloat16 --model /tmp/model --batch $b --context 512 --steps 20 > $OUT/step_profile_cuda_b$b.figures 2> $OUT/step_profile_cuda_b$b.txt
  cat $OUT/step_profile_cuda_b$b.figures; grep "mean step" $OUT/step_profile_cuda_b$b.txt
done
