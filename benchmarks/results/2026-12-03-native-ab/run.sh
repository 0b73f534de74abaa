#!/bin/bash
# Is today's slower native k = 2 TPOT (../2026-12-03-protected-k2: 24.2 s against 15.62 s on
# 2026-11-29) the VM's sitting or the code? protected_bench --contexts 16 (two layers, the
# refresh between them) at 1b28218 (the code of 2026-11-29's last k = 2 run) and at this
# session's HEAD, three rounds alternating, through ../2026-11-27-rotations/commits.sh.
cd "$(dirname "$0")"
commits="1b28218 ${HEAD_COMMIT:-$(git rev-parse --short HEAD)}"
source ../2026-11-27-rotations/commits.sh
bench_rounds native
