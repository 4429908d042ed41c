#!/usr/bin/env bash
# Data parallelism against PyTorch DistributedDataParallel (issue 33: data
# parallelism that speeds training up). Four models, each at a fixed GLOBAL
# batch that the workers split. Three are exported from PyTorch 1.13
# (bench/peers/torch_ddp_step.py; seed 0, random weights) and imported with
# `strata import`:
#   mlp       MLP 784-512-256-10, batch 32 (small: communication-bound)
#   widemlp   MLP 784-2048-2048-10, batch 256 (large matrix products; $WIDEMLP_BATCH)
#   resnet18  torchvision resnet18 without batch norm, 10 classes, 3x64x64, batch 2
# The fourth is built on each side, since strata cannot split an imported
# transformer for data parallelism yet: `strata zoo gpt` and its PyTorch mirror
# (class Gpt of bench/peers/torch_gpt_forward.py), the same architecture and
# sizes (the parameter counts are checked to match):
#   gpt       GPT, 3 layers, hidden 256, 4 heads, seq 128, vocab 512, batch 8
#             rows of random tokens with random token labels, the loss over
#             every token ($GPT_BATCH). The compute-bound model: about 150-300 ms
#             a training step on one thread.
# One training step each (cross entropy, SGD lr 1e-2 without momentum), every
# worker on one thread (OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1), side by side
# in one run:
#   strata 1 process (the one-device plan), the --mesh 2x1x1 plan on 2 threads
#   (wall clock, and the device clock: a core per device) and on 2 MPI ranks;
#   the --mesh 4x1x1 plan on 4 MPI ranks where `nproc` >= 4, else on 4 threads
#   by the device clock; PyTorch 1 process and DDP on 2 (and 4) processes.
# strata's figure is `strata run`'s `steady` (or `device`) line, the median
# step from the third step on; PyTorch's is rank 0's median step after warm-up.
# The configurations alternate in ROUNDS rounds so noise shows; the median is
# over the rounds. Speed-up is against the same framework's 1 process,
# efficiency is speed-up / workers, strata / PyTorch is the time ratio at the
# same number of workers, wall clock against wall clock (below 1 strata is
# faster). A last table trains the compute-bound gpt as a 2-stage pipeline
# (--mesh 1x1x2, $MICROBATCHES micro-batches) and 2-way tensor-parallel (--mesh
# 1x2x1) against its one-device plan (strata only). A plan or run strata
# refuses keeps its row, with the error under the table.
# Needs Debian's python3-torch and python3-torchvision, and Open MPI's mpirun.
# Record the output under bench/results/.
#
# Usage: bench/run_dp.sh [build-dir]   (default: build)
# Environment: ROUNDS (3); STEPS (all models), or STEPS_MLP (30),
#   STEPS_WIDEMLP (12), STEPS_RESNET18 (12), STEPS_GPT (10); MICROBATCHES (4);
#   WIDEMLP_BATCH (256); GPT_BATCH (8: a multiple of 4 and of MICROBATCHES);
#   MODELS ("mlp widemlp resnet18 gpt": the models to run; the last table
#   needs gpt); RUN_LIMIT (600 s a command); NO_BUILD=1 skips ninja.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
strata="$build/tools/strata"
torch_peer="$root/bench/peers/torch_ddp_step.py"
[[ -n ${NO_BUILD:-} ]] || ninja -C "$build" -j1 tools/strata >/dev/null
rounds=${ROUNDS:-3}
microbatches=${MICROBATCHES:-4}
limit=${RUN_LIMIT:-600}
export WIDEMLP_BATCH=${WIDEMLP_BATCH:-256} GPT_BATCH=${GPT_BATCH:-8}
# `strata zoo gpt` sizes: the same as GPT in bench/peers/torch_ddp_step.py.
gpt_zoo=(--layers 3 --hidden 256 --heads 4 --seq 128 --vocab 512 --batch "$GPT_BATCH")
declare -A steps=([mlp]=${STEPS_MLP:-${STEPS:-30}} [widemlp]=${STEPS_WIDEMLP:-${STEPS:-12}}
                  [resnet18]=${STEPS_RESNET18:-${STEPS:-12}} [gpt]=${STEPS_GPT:-${STEPS:-10}})
declare -A about=([mlp]="MLP 784-512-256-10, batch 32"
                  [widemlp]="MLP 784-2048-2048-10, batch $WIDEMLP_BATCH"
                  [resnet18]="resnet18, 3x64x64, batch 2"
                  [gpt]="GPT 3 layers, hidden 256, 4 heads, seq 128, vocab 512, batch $GPT_BATCH")
read -r -a models <<<"${MODELS:-mlp widemlp resnet18 gpt}"
for model in "${models[@]}"; do
  [[ -n ${steps[$model]:-} ]] || { echo "MODELS: unknown model '$model'" >&2; exit 1; }
done
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
# mpirun refuses root without these; CI containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(mpirun --oversubscribe)
# Cores this process may use (nproc itself would answer $OMP_NUM_THREADS).
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "nproc: $cores (of $(nproc --all)); $(uptime)"
echo "$("$strata" --version); PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'); $(mpirun --version | head -1)"
echo "$rounds rounds; one thread per worker"
if ! out=$(/usr/bin/python3 "$torch_peer" export "$work" 2>&1); then
  echo "$out" >&2
  exit 1
fi
torch_gpt_parameters=$(sed -n 's/^gpt parameters \([0-9]*\)$/\1/p' <<<"$out")

# One line of a failed command's output for the table's notes: strata's own
# error, else the last line; pipes escaped for markdown.
error_line() {
  local line
  line=$(grep -m1 'strata: error' <<<"$1" || grep -m1 -E 'Error|error:' <<<"$1" ||
    grep -v '^[[:space:]]*$' <<<"$1" | tail -1 || true)
  line=${line:-no output}
  echo "${line//|/\\|}"
}

declare -A plan_error   # plan file -> why it could not be made
# compile NAME PLAN [options...]: a training plan of $work/NAME.strata.
compile() {
  local name=$1 plan=$2 out
  shift 2
  if [[ ! -f $work/$name.strata ]]; then
    plan_error[$plan]="no model (see above)"
  elif ! out=$("$strata" compile "$work/$name.strata" --train --loss softmax_cross_entropy \
      --optimizer sgd:lr=1e-2 "$@" -o "$plan" 2>&1); then
    plan_error[$plan]="strata compile $* : $(error_line "$out")"
  fi
}

declare -A times errors  # row key -> " ms ms ..." per round; first error
# measure KEY LINE COMMAND...: runs COMMAND and appends the ms of its output's
# LINE (steady, device, or median_ms= for PyTorch) to times[KEY].
measure() {
  local key=$1 line=$2 out value=""
  shift 2
  if out=$(timeout -k 5 "$limit" "$@" 2>&1); then
    if [[ $line == median_ms ]]; then
      value=$(sed -nE 's/.* median_ms=([0-9.]+).*/\1/p' <<<"$out" | head -1)
    else
      value=$(sed -nE "s/^$line +([0-9.]+) ms per step.*/\1/p" <<<"$out" | head -1)
    fi
    [[ -n $value ]] || : "${errors[$key]:="no '$line' line: $(error_line "$out")"}"
  else
    : "${errors[$key]:="$(error_line "$out")"}"
  fi
  times[$key]+=" ${value:-error}"
}

# run_strata KEY LINE PLAN RANKS [run options...]: RANKS 0 runs threads.
run_strata() {
  local key=$1 line=$2 plan=$3 ranks=$4 n
  shift 4
  if [[ -n ${plan_error[$plan]:-} ]]; then
    : "${errors[$key]:="${plan_error[$plan]}"}"
    times[$key]+=" error"
    return
  fi
  n=${steps[$model]}
  local cmd=("$strata" run "$plan" --steps "$n" --log-every "$n" "$@")
  if ((ranks)); then cmd=("${mpirun[@]}" -np "$ranks" "${cmd[@]}"); fi
  measure "$key" "$line" "${cmd[@]}"
}

median() { tr ' ' '\n' | awk '/^[0-9.]+$/' | sort -g | awk '{ v[NR] = $1 }
  END { if (NR) printf "%.3f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# table TITLE KEY... : one row per KEY, from label[KEY], workers[KEY], base[KEY]
# (the 1-process row it is sped up against) and peer[KEY] (the PyTorch row it
# is compared with; empty for none: no column where no row has one). Errors
# follow the table, each once with the rows it struck.
declare -A label workers base peer
table() {
  local title=$1 key r med b p cells ratio="" msg
  local -A struck=()
  local order=()
  shift
  for key in "$@"; do [[ -z ${peer[$key]:-} ]] || ratio=1; done
  echo
  echo "$title"
  echo
  local head="| run | workers |" rule="|---|---:|"
  for ((r = 1; r <= rounds; r++)); do head+=" round $r |"; rule+="---:|"; done
  head+=" median ms | speed-up vs own 1 process | efficiency |"
  rule+="---:|---:|---:|"
  if [[ -n $ratio ]]; then head+=" strata / PyTorch |"; rule+="---:|"; fi
  echo "$head"
  echo "$rule"
  for key in "$@"; do
    cells=$(tr ' ' '\n' <<<"${times[$key]}" |
      awk 'NF { printf " %s |", $1 == "error" ? "error" : sprintf("%.2f", $1) }')
    med=$(median <<<"${times[$key]}")
    b=$(median <<<"${times[${base[$key]}]}")
    p=""
    [[ -z ${peer[$key]:-} ]] || p=$(median <<<"${times[${peer[$key]}]}")
    awk -v l="${label[$key]}" -v w="${workers[$key]}" -v c="$cells" -v m="$med" -v b="$b" \
      -v p="$p" -v ratio="$ratio" 'BEGIN { printf "| %s | %d |%s %s | ", l, w, c, m == "" ? "error" : m
        if (m == "" || b == "") printf "- | - |"; else printf "%.2f | %.0f%% |", b / m, 100 * b / m / w
        if (ratio == "") print ""; else if (m == "" || p == "") print " - |"; else printf " %.2f |\n", m / p }'
    msg=${errors[$key]:-}
    [[ -n $msg ]] || continue
    [[ -n ${struck[$msg]:-} ]] || order+=("$msg")
    struck[$msg]+="${struck[$msg]:+; }${label[$key]}"
  done
  if ((${#order[@]})); then
    printf '\nErrors:\n'
    for msg in "${order[@]}"; do echo "- ${struck[$msg]}: $msg"; done
  fi
}

# Rows of the data-parallel tables: key=label:workers:base:peer.
rows=("s1=strata, 1 process:1:s1:t1"
      "s2t=strata, 2 threads:2:s1:t2"
      "s2d=strata, 2 threads, device clock:2:s1:"
      "s2m=strata, 2 MPI ranks:2:s1:t2")
if ((cores >= 4)); then rows+=("s4m=strata, 4 MPI ranks:4:s1:t4"); else
  rows+=("s4d=strata, 4 threads, device clock ($cores cores):4:s1:"); fi
rows+=("t1=PyTorch, 1 process:1:t1:" "t2=PyTorch DDP, 2 processes:2:t1:")
((cores < 4)) || rows+=("t4=PyTorch DDP, 4 processes:4:t1:")

for model in "${models[@]}"; do
  if [[ $model == gpt ]]; then
    if ! out=$("$strata" zoo gpt "${gpt_zoo[@]}" -o "$work/$model.strata" 2>&1); then
      echo "$model: strata zoo gpt: $(error_line "$out")"
    else
      # "wrote FILE: gpt, 2,533,632 parameters (...)"
      count=$(sed -nE 's/.*: gpt, ([0-9,]+) parameters.*/\1/p' <<<"$out" | tr -d ,)
      if [[ $count != "$torch_gpt_parameters" ]]; then
        echo "gpt: strata has ${count:-?} parameters, PyTorch ${torch_gpt_parameters:-?}:" \
          "not the same network" >&2
        exit 1
      fi
    fi
  elif ! out=$("$strata" import "$work/$model.onnx" -o "$work/$model.strata" 2>&1); then
    echo "$model: strata import: $(error_line "$out")"
  fi
  compile "$model" "$work/$model.one.splan"
  compile "$model" "$work/$model.dp2.splan" --mesh 2x1x1
  compile "$model" "$work/$model.dp4.splan" --mesh 4x1x1
  keys=()
  for row in "${rows[@]}"; do
    key=$model.${row%%=*}
    IFS=: read -r label["$key"] workers["$key"] b p <<<"${row#*=}"
    base[$key]=$model.$b
    peer[$key]=${p:+$model.$p}
    keys+=("$key")
  done
  n=${steps[$model]}
  for ((r = 1; r <= rounds; r++)); do
    run_strata "$model.s1" steady "$work/$model.one.splan" 0
    run_strata "$model.s2t" steady "$work/$model.dp2.splan" 0
    run_strata "$model.s2d" device "$work/$model.dp2.splan" 0 --clock device
    run_strata "$model.s2m" steady "$work/$model.dp2.splan" 2
    if ((cores >= 4)); then run_strata "$model.s4m" steady "$work/$model.dp4.splan" 4; else
      run_strata "$model.s4d" device "$work/$model.dp4.splan" 0 --clock device; fi
    measure "$model.t1" median_ms /usr/bin/python3 "$torch_peer" time "$model" 1 "$n"
    measure "$model.t2" median_ms /usr/bin/python3 "$torch_peer" time "$model" 2 "$n"
    ((cores < 4)) || measure "$model.t4" median_ms /usr/bin/python3 "$torch_peer" time "$model" 4 "$n"
  done
  table "### $model (${about[$model]}; $n steps x $rounds rounds): data parallelism" "${keys[@]}"
done

# Pipeline and tensor parallelism of the compute-bound model against its
# one-device plan (made above).
model=gpt
if [[ " ${models[*]} " != *" $model "* ]]; then
  echo
  echo "(no pipeline and tensor-parallel table: MODELS lacks $model)"
  echo
  uptime
  exit 0
fi
compile "$model" "$work/$model.pp2.splan" --mesh 1x1x2 --microbatches "$microbatches"
compile "$model" "$work/$model.tp2.splan" --mesh 1x2x1
keys=("$model.x1")
label[$model.x1]="strata, 1 process"; workers[$model.x1]=1; base[$model.x1]=$model.x1
for par in pp2 tp2; do
  if [[ $par == pp2 ]]; then what="pipeline 1x1x2, $microbatches micro-batches"; else
    what="tensor-parallel 1x2x1"; fi
  for how in t d m; do
    key=$model.$par$how
    case $how in
      t) label[$key]="$what, 2 threads" ;;
      d) label[$key]="$what, 2 threads, device clock" ;;
      m) label[$key]="$what, 2 MPI ranks" ;;
    esac
    workers[$key]=2; base[$key]=$model.x1; peer[$key]=""
    keys+=("$key")
  done
done
for ((r = 1; r <= rounds; r++)); do
  run_strata "$model.x1" steady "$work/$model.one.splan" 0
  for par in pp2 tp2; do
    run_strata "$model.${par}t" steady "$work/$model.$par.splan" 0
    run_strata "$model.${par}d" device "$work/$model.$par.splan" 0 --clock device
    run_strata "$model.${par}m" steady "$work/$model.$par.splan" 2
  done
done
table "### $model (${about[$model]}; ${steps[$model]} steps x $rounds rounds): pipeline and tensor parallelism" \
  "${keys[@]}"
echo
uptime
