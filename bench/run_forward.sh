#!/usr/bin/env bash
# One forward pass of `strata zoo gpt --layers 2` (and the zoo MLP and convnet)
# on the CPU executor, against the same GPT in PyTorch (bench/peers/torch_gpt_forward.py),
# both on one thread. Prints both tables; record them under bench/results/.
#
# Usage: bench/run_forward.sh [build-dir]   (default: build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
ninja -C "$build" bench/forward_bench >/dev/null
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
uptime
"$build/bench/forward_bench" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_min_time=1
/usr/bin/python3 "$root/bench/peers/torch_gpt_forward.py" --threads 1 --min-time 3
