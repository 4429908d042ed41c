#!/usr/bin/env bash
# Pipeline benchmarks; record the output under bench/results/.
#  1. Bubble and prediction: a GPT trained as a 1F1B pipeline on P CPU device
#     threads (P = 2, 4; M = 4, 8, 16), timed by the device clock (a core per
#     device, whatever this machine has): measured bubble against
#     (p-1)/(m+p-1) and the plan's own, predicted step time (profiled node
#     times, and the roofline of a cluster spec measured by `strata
#     calibrate`) against the measured one. Two shapes: 8 layers with a
#     512-token vocabulary (its head makes the stages uneven) and 16 layers
#     with 64 tokens (stages within a few percent of each other), the latter
#     under 1F1B and the interleaved schedule (2 model chunks per device) back
#     to back.
#  2. Compile time: a GPT-3-175B-shaped model into a 96-stage plan.
#
# Usage: bench/run_pipeline.sh [build-dir]   (default: build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
ninja -C "$build" -j1 bench/pipeline_bench bench/compile_bench tools/strata >/dev/null
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
spec="$(mktemp --suffix=.json)"
trap 'rm -f "$spec"' EXIT
"$build/tools/strata" calibrate --devices 4 -o "$spec" >/dev/null
echo "cores: $(nproc --all); $(uptime)"
"$build/bench/pipeline_bench" --cluster "$spec"
echo
"$build/bench/pipeline_bench" --cluster "$spec" --layers 16 --vocab 64 --chunks 2
echo
uptime
for m in 8 96; do
  /usr/bin/time -f "wall %e s, max RSS %M KiB" \
    "$build/bench/compile_bench" --microbatches "$m" \
    --cluster "$root/examples/clusters/h100-128-nodes.json"
done
