#!/usr/bin/env bash
# ONNX-imported models against PyTorch 1.13 on the same machine: ResNet-18 and
# MobileNetV2 (batch 4, 224x224) and a 4-layer GPT (batch 4, seq 64, hidden
# 256), exported from PyTorch with random weights and imported with `strata
# import`; inference and one training step (cross entropy, SGD), on 1 and 2
# threads. Needs Debian's python3-torch and python3-torchvision. Prints a
# markdown table (ratio = strata time / PyTorch time; below 1 strata is
# faster); record it under bench/results/.
#
# Usage: bench/run_onnx.sh [build-dir]   (default: build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
strata="$build/tools/strata"
peer="$root/bench/peers/torch_onnx_models.py"
ninja -C "$build" -j1 tools/strata >/dev/null
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 "$peer" export "$work" 2>/dev/null
echo "cores: $(nproc --all); $(uptime)"
echo
echo "| model | threads | strata infer | PyTorch infer | ratio | strata train step | PyTorch train step | ratio |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for name in resnet18 mobilenet_v2 gpt4; do
  # The GPT's causal mask is a buffer in PyTorch, not a parameter: --constant.
  if [[ $name == gpt4 ]]; then shape=input=4x64; keep=(--constant mask); else
    shape=input=4x3x224x224; keep=(); fi
  "$strata" import "$work/$name.onnx" --input-shape "$shape" "${keep[@]}" \
    -o "$work/$name.strata" >/dev/null
  "$strata" compile "$work/$name.strata" --train --loss softmax_cross_entropy \
    --optimizer sgd:lr=0.01 -o "$work/$name.splan" >/dev/null
  for threads in 1 2; do
    export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
    infer=$("$strata" run "$work/$name.strata" --repeat 10 |
      sed -nE 's/^time +median ([0-9.]+) ms.*/\1/p')
    # Seconds per step from "done  12 steps in 4.23 s": the steps/s figure is
    # rounded too coarsely for slow steps.
    step_ms=$("$strata" run "$work/$name.splan" --steps 12 |
      sed -nE 's/^done +([0-9]+) steps? in ([0-9.]+) s.*/\1 \2/p' | awk '{ print 1000 * $2 / $1 }')
    read -r t_infer t_train < <(/usr/bin/python3 "$peer" time "$name" "$threads" 2>/dev/null)
    awk -v n="$name" -v t="$threads" -v si="$infer" -v pi="$t_infer" -v st="$step_ms" -v pt="$t_train" \
      'BEGIN { printf "| %s | %d | %.1f ms | %.1f ms | %.2f | %.1f ms | %.1f ms | %.2f |\n",
               n, t, si, pi, si / pi, st, pt, st / pt }'
  done
done
echo
uptime
