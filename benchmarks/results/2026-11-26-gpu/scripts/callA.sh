source .gpukit/setup.sh
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; stamp() { echo "== $1 at $(el) s"; }
stamp tests
TRITON_INTERPRET=0 VEIL_TEST_MODEL=/tmp/model timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_native_cuda.py 2>&1 | tail -40 > $OUT/tests.txt; tail -25 $OUT/tests.txt
stamp protected_sessions
timeout 230 python3 -m veil.benchmarks.protected_sessions --device cuda --model /tmp/model --sessions 1,4,16 --warmup --out $OUT/protected_sessions_cuda.json 2>&1 | grep -v "it/s" > $OUT/protected_sessions_cuda.txt; rc=$?
grep -v "^figure protected.sessions.server_s\.[a-z]" $OUT/protected_sessions_cuda.txt | tail -40
if ! grep -q "tpot_s.s1" $OUT/protected_sessions_cuda.txt && [ $(el) -lt 250 ]; then
  stamp protected_sessions_twins
  TRITON_INTERPRET=1 timeout 150 python3 -m veil.benchmarks.protected_sessions --device cuda --model /tmp/model --sessions 1,4 --out $OUT/protected_sessions_cuda_twins.json 2>&1 | grep -v "it/s" > $OUT/protected_sessions_cuda_twins.txt; tail -30 $OUT/protected_sessions_cuda_twins.txt
fi
stamp he_ops
[ $(el) -lt 400 ] && timeout $(( 470 - $(el) )) python3 -m veil.benchmarks.he_ops --backends seal,native --device cuda --repeat 5 --out $OUT/he_ops_cuda.json 2>&1 | grep -v "it/s" > $OUT/he_ops_cuda.txt; tail -40 $OUT/he_ops_cuda.txt
stamp end
