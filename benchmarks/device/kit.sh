#!/usr/bin/env bash
# Builds .gpukit/ (ignored), what a call on the lent GPU machine needs and that machine lacks:
#   whl/            wheels for its Python 3.12 of the packages below, at the versions this
#                   checkout's .venv holds (it has torch, triton and transformers, not these)
#   smollm2-shape/  the shipped model's config.json and tokenizer, no weights: the weights
#                   (270 MB in bf16) are over what a call carries, so random_model.py draws
#                   weights of that shape on the machine
# Run here after `make install`:  bash benchmarks/device/kit.sh   (about 30 MB; carry ".gpukit")
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
KIT=.gpukit
# cryptography..zstandard: the HE layer and the wire; gguf: the loader's imports; the rest:
# `veil serve` (FastAPI on uvicorn), for the served fast path.
PKGS="cryptography cffi pycparser tenseal zstandard gguf fastapi starlette pydantic pydantic_core
      annotated-types typing-inspection uvicorn"
rm -rf "$KIT"
mkdir -p "$KIT/whl"
for p in $PKGS; do
  v=$($PY -m pip show "$p" 2>/dev/null | awk '/^Version:/ {print $2}')
  [ -n "$v" ] || { echo "kit: $p is not in .venv (make install first)" >&2; exit 1; }
  echo "$p==$v"
done > "$KIT/requirements.txt"
plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
# shellcheck disable=SC2086
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat \
  -d "$KIT/whl" -r "$KIT/requirements.txt" 2>&1 | grep -v "^WARNING: Location" || true
ls "$KIT"/whl/*.whl | wc -l | grep -qx "$(wc -l < "$KIT/requirements.txt")" || { echo "kit: a wheel is missing" >&2; exit 1; }
$PY benchmarks/export_hf.py "$KIT/shape-tmp" --dtype bfloat16 > /dev/null 2>&1
mkdir -p "$KIT/smollm2-shape"
for f in "$KIT"/shape-tmp/*; do
  case "$f" in *.safetensors) ;; *) cp "$f" "$KIT/smollm2-shape/" ;; esac
done
rm -rf "$KIT/shape-tmp"
# named for what the device call will load: random weights of this shape, not the shipped ones
$PY -c "import json, sys; p = sys.argv[1]; c = json.load(open(p)); c['_name_or_path'] = 'smollm2-135m-shape-random'; json.dump(c, open(p, 'w'), indent=2)" "$KIT/smollm2-shape/config.json"
git rev-parse --short HEAD > "$KIT/built-at"
du -sh "$KIT"; ls "$KIT/whl"
