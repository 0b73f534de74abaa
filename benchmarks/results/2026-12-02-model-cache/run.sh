#!/usr/bin/env bash
# The start-up figures of README.md, from the repository root's venv. The suite rows: fresh
# clones of each commit run with `CI=true VEIL_MODEL_CACHE=<empty dir> bash .ci/run` (the last
# one also with VEIL_KERNEL_CACHE and TRITON_CACHE_DIR set to empty directories).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../../.."
.venv/bin/python "$here/startup.py" "$here/startup.json" | tee "$here/startup.txt"
