#!/usr/bin/env bash
# One training step (forward + backward + optimizer update) of `strata zoo gpt --layers 2`
# and of the zoo convnet on the CPU executor, against the same models and step in
# PyTorch (bench/peers/torch_train_step.py), both on one thread. Prints both tables;
# record them under bench/results/.
#
# Usage: bench/run_train.sh [build-dir]   (default: build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
ninja -C "$build" -j1 bench/train_bench >/dev/null
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
uptime
"$build/bench/train_bench" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_min_time=1
uptime
/usr/bin/python3 "$root/bench/peers/torch_train_step.py" --threads 1 --min-time 3
uptime
