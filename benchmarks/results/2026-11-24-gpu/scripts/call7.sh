python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpukit/whl/*.whl || exit 1
mkdir -p /tmp/ns/veil
for d in client server crypto protected engine kernels cli benchmarks cluster; do ln -sfn "$PWD/$d" /tmp/ns/veil/$d; done
export PYTHONPATH=/tmp/ns:/tmp/site PYTHONUNBUFFERED=1
timeout 290 python3 -m veil.benchmarks.he_ops --backends native --device cuda --compile --repeat 10 --out $OUT/he_ops_cuda_compile.json 2>&1 | grep -v "it/s" | tail -40 | tee $OUT/he_ops_cuda_compile.txt
