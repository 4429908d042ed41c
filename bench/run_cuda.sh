#!/usr/bin/env bash
# GPU training steps: strata's CUDA backend against PyTorch on the same GPU, in
# the same run. Needs a GPU, the CUDA toolkit (nvcc) and PyTorch with CUDA.
#
# Most telling first (a run cut short keeps those): a small MLP, where
# launches dominate, and the zoo convnet (with its convolutions and pooling
# timed per pass), each trained by `strata run --backend cuda` with the step
# replayed as one CUDA Graph and with --no-cuda-graph (eager launches), against
# PyTorch's step eagerly and captured whole as a CUDA Graph
# (bench/peers/torch_cuda_step.py); all f32, TF32 off, SGD with momentum 0.9,
# the loss read back every step. Then a GPT of hidden 2048 in bf16 for the MFU
# target (strata --precision bf16 against torch.autocast, eager, captured and
# under torch.compile(mode="reduce-overhead")); a 4-layer GPT of hidden 512 in
# f32, bf16 and f16; that GPT as a 4-stage pipeline on the one GPU; and with
# two GPUs data-parallel and pipelined over NCCL. Rows give the steady state
# (strata: the median step after the first two; PyTorch: after 10 warm-up
# steps) and MFU against 989 TFLOP/s; strata's rows also the host time per
# step spent issuing the work (copies in, launches or the graph's replay).
# Record the output under bench/results/ with the GPU's name.
#
# Usage: bench/run_cuda.sh [build-dir]   (default: build-cuda, configured here)
# STRATA=path/to/strata uses that CLI instead of building one (scripts/gpu-check
# does, with its bundle); STRATA_BENCH_STEPS sets the timed steps per row
# (default 300).
# A row that fails prints its error and the rest still run (no `set -e`).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ -n "${STRATA:-}" ]; then
  strata="$STRATA"
else
  build="${1:-$root/build-cuda}"
  if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$root" -Dcuda=enabled -Dbench=disabled -Dtests=disabled >/dev/null
  fi
  ninja -C "$build" tools/strata >/dev/null || exit 1
  strata="$build/tools/strata"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
steps="${STRATA_BENCH_STEPS:-300}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
# What this card reaches (a bf16 8192^3 product, a 4 GiB copy), beside the
# datasheet peak the MFU column uses.
python3 "$root/bench/peers/torch_ceilings.py"

# MFU is the plan's FLOPs per step (strata's "compute" line: the op
# registry's costs of every node run, forward and backward) times steps/s,
# over the H100 SXM's dense bf16 tensor-core peak (989 TFLOP/s, NVIDIA's
# datasheet); the PyTorch rows use the same FLOPs per step. The f32 rows are
# far below it by construction (f32 without TF32 does not use the tensor cores).
peak=989e12
flops_per_step=0 # of the last strata run
strata_steps() { # plan, extra flags...
  local plan="$1"
  shift
  flops_per_step=0
  if ! "$strata" run "$plan" --backend cuda --steps "$steps" --log-every "$steps" "$@" \
    >"$work/run.out" 2>&1; then
    echo "FAILED: $(tail -1 "$work/run.out")  $*"
    return
  fi
  flops_per_step=$(sed -n 's/^compute *\([0-9.]*\) \([KMGTP]\?\)FLOP per step.*/\1 \2/p' \
    "$work/run.out" | awk '{ m = 1; if ($2 == "K") m = 1e3; if ($2 == "M") m = 1e6;
      if ($2 == "G") m = 1e9; if ($2 == "T") m = 1e12; if ($2 == "P") m = 1e15; print $1 * m }')
  # The steady state (the median step after the first two, which load the
  # kernels and capture the step), as PyTorch's rows time theirs after warm-up.
  local host
  host=$(sed -n 's/^host *\([0-9.]*\) us per step.*/\1/p' "$work/run.out")
  sed -n 's/^steady *\([0-9.]*\) ms per step.*/\1/p' "$work/run.out" |
    awk -v f="$*" -v flops="$flops_per_step" -v peak="$peak" -v host="${host:-?}" \
      '{ printf "%9.3f ms/step %10.1f steps/s  MFU %5.2f%%  host %s us/step  %s\n", $1,
         1000 / $1, 100 * flops * (1000 / $1) / peak, host, f }'
}

# PyTorch's lines ("... <ms> ms/step <rate> steps/s") with the MFU of the same
# FLOPs per step.
with_mfu() {
  awk -v flops="$flops_per_step" -v peak="$peak" '/steps\/s/ {
    for (i = 1; i < NF; ++i) if ($(i + 1) == "steps/s") rate = $i
    printf "%s  MFU %5.2f%%\n", $0, 100 * flops * rate / peak; next } { print }'
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
  python3 "$root/bench/peers/torch_cuda_step.py" $torch_args --steps "$steps" |
    grep -v '^device' | with_mfu
}

run_model mlp "mlp --input 784 --hidden 256,256 --classes 10 --batch 32" \
  "mlp --input 784 --hidden 256,256 --classes 10 --batch 32"
run_model convnet "convnet --batch 32" "convnet --batch 32"
# The conv+fc network's convolutions split as the survey's table splits them
# (REFERENCE.md: "Survey on Distributed Neural Networks and GPU Programming
# Frameworks", Table 1: forward 0.207 / 0.138 ms, backward-data 0.215 / 0.113
# ms, backward-weights 0.029 / 0.199 ms for cuDNN-direct / PyTorch, on their
# network and GPU): strata's Conv2d, Conv2dGradInput and Conv2dGradWeight
# nodes of the zoo convnet's step, timed one by one (--op-times).
echo "== convnet, convolution time per pass (one step, eager, per-node events)"
"$strata" run "$work/convnet.splan" --backend cuda --steps 3 --op-times |
  grep -E '^ +(op |Conv2d|Conv2dGradInput|Conv2dGradWeight|Gemm|total)'
# Its pooling through cuDNN (the default) and through strata's own kernels.
for pool_norm in cudnn strata; do
  echo "== convnet, pooling with --pool-norm $pool_norm (one step, eager, per-node events)"
  "$strata" run "$work/convnet.splan" --backend cuda --steps 3 --op-times \
    --pool-norm "$pool_norm" | grep -E '^ +(op |MaxPool2d|MaxPool2dGrad|total)'
done
# The MFU target (45% of 989 TFLOP/s at hidden >= 2048): a wider GPT, where
# the matrix products dominate, in bf16.
wide="--layers 4 --hidden 2048 --heads 16 --seq 1024 --vocab 8192 --batch 8"
echo "== gpt hidden 2048, bf16: strata zoo gpt $wide"
# shellcheck disable=SC2086
"$strata" zoo gpt $wide -o "$work/wide.strata" >/dev/null
"$strata" compile "$work/wide.strata" --train --optimizer sgd:lr=0.01,momentum=0.9 \
  -o "$work/wide.splan" >/dev/null
rm -f "$work/wide.strata"
echo -n "strata wide bf16 graph "
strata_steps "$work/wide.splan" --precision bf16
# shellcheck disable=SC2086
python3 "$root/bench/peers/torch_cuda_step.py" gpt $wide --steps "$steps" --compile --bf16 |
  grep -v '^device' | with_mfu

gpt="--layers 4 --hidden 512 --heads 8 --seq 256 --vocab 8192 --batch 8"
run_model gpt "gpt $gpt" "gpt $gpt"

# Mixed precision: strata's bf16 GEMMs (f32 everywhere else) against PyTorch's
# autocast(bfloat16).
echo "== gpt, bf16"
echo -n "strata gpt bf16 graph "
strata_steps "$work/gpt.splan" --precision bf16
echo -n "strata gpt bf16 eager "
strata_steps "$work/gpt.splan" --precision bf16 --no-cuda-graph
# f16 operands, each scaled into f16's range on the device (two extra
# passes over every GEMM operand: its largest magnitude, then the rounding).
echo -n "strata gpt f16 graph  "
strata_steps "$work/gpt.splan" --precision f16
# shellcheck disable=SC2086
python3 "$root/bench/peers/torch_cuda_step.py" gpt $gpt --steps "$steps" --bf16 |
  grep -v '^device' | with_mfu

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

# With two or more GPUs: the same GPT as two data-parallel replicas (a GPU
# each, gradients all-reduced over NCCL in buckets) and as a 2-stage pipeline
# over two GPUs (activations sent over NCCL). Each step does the one-GPU
# step's work per replica, so steps/s against the single-GPU row is the
# scaling. MFU is over one GPU's peak.
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
if [ "$gpus" -ge 2 ]; then
  echo "== gpt over 2 GPUs (NCCL)"
  "$strata" compile "$work/gpt.strata" --train --optimizer sgd:lr=0.01,momentum=0.9 \
    --mesh 2x1x1 -o "$work/gpt_dp2.splan" >/dev/null
  echo -n "strata gpt dp2 graph  "
  strata_steps "$work/gpt_dp2.splan" --gpus 0,1
  "$strata" compile "$work/gpt.strata" --train --optimizer sgd:lr=0.01,momentum=0.9 \
    --mesh 1x1x2 --microbatches 8 -o "$work/gpt_pp2.splan" >/dev/null
  echo -n "strata gpt pp2 graph  "
  strata_steps "$work/gpt_pp2.splan" --gpus 0,1
else
  echo "== one GPU here: the NCCL rows (data parallel and pipeline over 2 GPUs) need two"
fi
