#!/usr/bin/env bash
# Gradient-bucket benchmark (issue 5): how much of the data-parallel gradient
# reduction the buckets hide behind backward.
#  1. Predicted: a GPT (8 layers, hidden 1024, seq 512, AdamW) compiled with
#     --bucket-mb 25 and with --bucket-mb 0 (one blocking all-reduce per
#     gradient after backward) onto the 8x H100 NVLink node and onto 2 nodes of
#     the 128-node cluster; the step time the simulator predicts for each.
#  2. Measured on this machine: the same comparison for a small GPT at dp=2 on
#     the CPU devices (threads), steps per second and the losses.
# Record the output under bench/results/.
#
# Usage: bench/run_buckets.sh [build-dir]   (default: build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
ninja -C "$build" -j1 tools/strata >/dev/null
strata="$build/tools/strata"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
echo "cores: $(nproc --all); $(uptime)"
echo
echo "| model | mesh | M | cluster | bucket MiB | predicted step ms |"
echo "|---|---|---|---|---|---|"
"$strata" zoo gpt --layers 8 --hidden 1024 --heads 16 --seq 512 --batch 32 -o big.strata >/dev/null
predict() { # mesh microbatches cluster bucket
  "$strata" compile big.strata --train --optimizer adamw:lr=1e-4 --mesh "$1" --microbatches "$2" \
    --cluster "$root/examples/clusters/$3.json" --bucket-mb "$4" -o p.splan |
    sed -n 's/^predicted    step \([0-9.]*\) ms.*/\1/p'
}
for config in "8x1x1 1 h100-8x-nvlink" "8x1x1 4 h100-8x-nvlink" "16x1x1 2 h100-128-nodes" \
  "4x1x2 4 h100-8x-nvlink"; do
  set -- $config
  for bucket in 25 0; do
    echo "| gpt 8x1024 | $1 | $2 | $3 | $bucket | $(predict "$1" "$2" "$3" "$bucket") |"
  done
done
echo
"$strata" zoo gpt --layers 4 --hidden 256 --heads 4 --seq 64 --batch 8 -o small.strata >/dev/null
for bucket in 1 0; do
  "$strata" compile small.strata --train --mesh 2x1x1 --bucket-mb "$bucket" \
    --cluster "$root/examples/clusters/cpu-dev.json" -o "s$bucket.splan" >/dev/null
done
for round in 1 2 3; do
  for bucket in 1 0; do
    echo "measured dp=2 --bucket-mb $bucket: $("$strata" run "s$bucket.splan" --steps 40 | grep '^steady')"
  done
done
