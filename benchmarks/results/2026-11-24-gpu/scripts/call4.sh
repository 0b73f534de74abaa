python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpukit/whl/*.whl || exit 1
mkdir -p /tmp/ns/veil
for d in client server crypto protected engine kernels cli benchmarks cluster; do ln -sfn "$PWD/$d" /tmp/ns/veil/$d; done
export PYTHONPATH=/tmp/ns:/tmp/site PYTHONUNBUFFERED=1
timeout 400 python3 -m veil.benchmarks.he_batch --device cuda --batches 1,4,16,64,128 --repeat 10 --out $OUT/he_batch_cuda.json 2>&1 | tee $OUT/he_batch_cuda.txt
