# sourced at the start of every device call: wheels, the veil namespace, a random-weight model
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpukit/whl/*.whl || exit 1
mkdir -p /tmp/ns/veil
for d in client server crypto protected engine kernels cli benchmarks cluster; do ln -sfn "$PWD/$d" /tmp/ns/veil/$d; done
export PYTHONPATH=/tmp/ns:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python3 .gpukit/random_model.py .gpukit/smollm2-shape /tmp/model || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
