# Sourced at the start of every call on the lent GPU machine (carry ".gpukit", built by kit.sh):
# the wheels into /tmp/site, the `veil` namespace by symlinks (the checkout is not installed
# there), and a random-weight model of the shipped model's shape in /tmp/model.
# Redirect, do not pipe (`source setup.sh > /tmp/setup.txt 2>&1`): a pipe runs it in a subshell
# and the exports are lost. It also defines the call scripts' clock: `stamp NAME` logs the seconds
# since the set-up started to $OUT/log.txt, and `within N` prints a step's timeout, at most N and at most
# what is left of $BUDGET, or fails when under 20 s are left (the step is then skipped).
t0=$(date +%s)  # the budget counts from here, set-up included
[ -d .gpukit/whl ] || { echo "setup: no .gpukit (bash benchmarks/device/kit.sh here, then carry it)"; return 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpukit/whl/*.whl || return 1
mkdir -p /tmp/ns/veil
for d in client server crypto protected engine kernels cli benchmarks cluster; do ln -sfn "$PWD/$d" /tmp/ns/veil/$d; done
export PYTHONSAFEPATH=1 PYTHONPATH=/tmp/ns:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRITON_INTERPRET=0
[ -f /tmp/model/model.safetensors ] || python3 benchmarks/device/random_model.py .gpukit/smollm2-shape /tmp/model || return 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
el() { echo $(( $(date +%s) - t0 )); }
stamp() { echo "== $1 at $(el) s" | tee -a "$OUT/log.txt"; }
within() { local left=$(( BUDGET - $(el) )); [ "$left" -ge 20 ] || return 1; echo $(( left < $1 ? left : $1 )); }
