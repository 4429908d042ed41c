#!/usr/bin/env bash
# Zero-bubble H1 against 1F1B (issue: plans as good as Megatron's, item 1):
# the predicted and the measured bubble of one GPT (`strata zoo gpt`, 4
# layers, hidden 512, 8 heads, seq 64, vocab 512, batch 16, AdamW) on
# --mesh 1x1x4 with M micro-batches, on CPU device threads timed by the device
# clock (each device thread's own CPU time, joined where it waits for
# another: the step as a core per device would run it).
#   predicted: `strata compile`'s bubble (the simulator's idle fraction).
#   measured:  1 - mean(measured busy) / device step, from `strata run
#              --steps 8 --clock device` (median step from the third); the
#              schedules alternate over ROUNDS rounds and the table gives the
#              median round.
# Usage: bench/run_zb.sh [build-dir]   (ROUNDS=3, MICROBATCHES="8 16" by default)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
rounds="${ROUNDS:-3}"
microbatches="${MICROBATCHES:-8 16}"
ninja -C "$build" -j1 tools/strata >/dev/null
strata="$build/tools/strata"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "cores: $(nproc --all); $(uptime)"
"$strata" zoo gpt --layers 4 --hidden 512 --heads 8 --seq 64 --vocab 512 --batch 16 \
  -o "$work/gpt.strata" >/dev/null
echo
echo "| M | schedule | predicted step | predicted bubble | ideal (equal F, B, W) | device step (rounds) | measured bubble |"
echo "|---:|---|---:|---:|---:|---:|---:|"
for m in $microbatches; do
  declare -A steps=() bubbles=() predicted=() ideal=()
  for s in 1f1b zb-h1; do
    out=$("$strata" compile "$work/gpt.strata" --train --optimizer adamw:lr=1e-3 --mesh 1x1x4 \
      --microbatches "$m" --schedule "$s" -o "$work/$s-$m.splan")
    line=$(grep '^predicted' <<<"$out")
    predicted[$s]=$(sed -E 's/.*step ([0-9.]+ ms), bubble ([0-9.]+%).*/\1 | \2/' <<<"$line")
    ideal[$s]=$(sed -E 's/.* = ([0-9.]+%).*/\1/' <<<"$line")
  done
  for r in $(seq "$rounds"); do
    for s in 1f1b zb-h1; do
      out=$("$strata" run "$work/$s-$m.splan" --steps 8 --clock device)
      step=$(grep -E '^device +[0-9.]+ ms per step' <<<"$out" | awk '{print $2}')
      busy=$(awk '/^device  predicted busy/ {t=1; next} t && /^ +[0-9]+ / {s+=$4; n++} END {print s/n}' <<<"$out")
      steps[$s]+="$step "
      bubbles[$s]+="$(awk -v b="$busy" -v t="$step" 'BEGIN {printf "%.1f", 100 * (1 - b / t)}') "
    done
  done
  for s in 1f1b zb-h1; do
    med=$(tr ' ' '\n' <<<"${steps[$s]}" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    bub=$(tr ' ' '\n' <<<"${bubbles[$s]}" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    echo "| $m | $s | ${predicted[$s]} | ${ideal[$s]} | $med ms (${steps[$s]% }) | $bub% (${bubbles[$s]% }) |"
  done
  unset steps bubbles predicted ideal
done
echo "$(uptime)"
