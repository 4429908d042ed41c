#!/usr/bin/env bash
# Plan-search benchmark (issue 5): `--auto` for a GPT-3-175B-shaped model onto
# the 128-node x 8 H100 cluster spec (1024 devices), for 12, 24, 48 and 96
# layers; once as f32 and once estimated as a bf16 mixed-precision run.
# Record the output under bench/results/.
#
# Usage: bench/run_search.sh [build-dir]   (default: build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
ninja -C "$build" -j1 bench/search_bench >/dev/null
cd "$root"
echo "cores: $(nproc --all); $(uptime)"
for precision in "" --bf16; do
  echo
  echo "search_bench ${precision:-(f32)}"
  /usr/bin/time -f "wall %e s, max RSS %M KiB" "$build/bench/search_bench" $precision
done
