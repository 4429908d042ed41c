#!/usr/bin/env bash
# GPU training steps: strata's CUDA backend against PyTorch on the same GPU, in
# the same run. Needs a GPU, the CUDA toolkit (nvcc) and PyTorch with CUDA.
#
# For each model (a small MLP, where launches dominate; the zoo convnet; a
# 4-layer GPT), trains `strata run --backend cuda` for --steps steps with the
# step replayed as one CUDA Graph and with --no-cuda-graph (eager launches),
# and times PyTorch's step eagerly, captured whole as a CUDA Graph, and under
# torch.compile(mode="reduce-overhead") (bench/peers/torch_cuda_step.py). All
# f32, TF32 off, SGD with momentum 0.9, the loss read back every step; then the
# GPT in bf16 (strata --precision bf16 against torch.autocast) and as a 4-stage
# pipeline on the one GPU.
# Record the output under bench/results/ with the GPU's name.
#
# Usage: bench/run_cuda.sh [build-dir]   (default: build-cuda, configured here)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build-cuda}"
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$root" -Dcuda=enabled -Dbench=disabled -Dtests=disabled >/dev/null
fi
ninja -C "$build" tools/strata >/dev/null
strata="$build/tools/strata"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
steps=300
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

# strata: steps/s from the final "done" line, as ms per step.
strata_steps() { # plan, extra flags...
  local plan="$1"
  shift
  "$strata" run "$plan" --backend cuda --steps "$steps" --log-every "$steps" "$@" |
    sed -n 's/.*(\([0-9.]*\) steps\/s).*/\1/p' | tail -1 |
    awk -v f="$*" '{ printf "%9.3f ms/step %10.1f steps/s %s\n", 1000 / $1, $1, f }'
}

run_model() { # name, zoo args, torch args
  local name="$1" zoo="$2" torch_args="$3"
  echo "== $name: strata zoo $zoo"
  # shellcheck disable=SC2086
  "$strata" zoo $zoo -o "$work/$name.strata" >/dev/null
  "$strata" compile "$work/$name.strata" --train --optimizer sgd:lr=0.01,momentum=0.9 \
    -o "$work/$name.splan" >/dev/null
  echo -n "strata $name graph    "
  strata_steps "$work/$name.splan"
  echo -n "strata $name eager    "
  strata_steps "$work/$name.splan" --no-cuda-graph
  # shellcheck disable=SC2086
  python3 "$root/bench/peers/torch_cuda_step.py" $torch_args --steps "$steps" --compile |
    grep -v '^device'
}

run_model mlp "mlp --input 784 --hidden 256,256 --classes 10 --batch 32" \
  "mlp --input 784 --hidden 256,256 --classes 10 --batch 32"
run_model convnet "convnet --batch 32" "convnet --batch 32"
gpt="--layers 4 --hidden 512 --heads 8 --seq 256 --vocab 8192 --batch 8"
run_model gpt "gpt $gpt" "gpt $gpt"

# Mixed precision: strata's bf16 GEMMs (f32 everywhere else) against PyTorch's
# autocast(bfloat16).
echo "== gpt, bf16"
echo -n "strata gpt bf16 graph "
strata_steps "$work/gpt.splan" --precision bf16
echo -n "strata gpt bf16 eager "
strata_steps "$work/gpt.splan" --precision bf16 --no-cuda-graph
# shellcheck disable=SC2086
python3 "$root/bench/peers/torch_cuda_step.py" gpt $gpt --steps "$steps" --compile --bf16 |
  grep -v '^device'

# The same GPT as a 4-stage 1F1B pipeline of 8 micro-batches, every stage on
# this one GPU (its own streams): what pipelining costs when nothing is gained
# from more GPUs, against the single-device step above.
echo "== gpt, 4-stage pipeline on one GPU"
"$strata" compile "$work/gpt.strata" --train --optimizer sgd:lr=0.01,momentum=0.9 \
  --mesh 1x1x4 --microbatches 8 -o "$work/gpt_pp.splan" >/dev/null
echo -n "strata gpt pp4 graph  "
strata_steps "$work/gpt_pp.splan"
echo -n "strata gpt pp4 eager  "
strata_steps "$work/gpt_pp.splan" --no-cuda-graph
