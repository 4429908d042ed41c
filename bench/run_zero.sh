#!/usr/bin/env bash
# ZeRO stages side by side: memory per device and step time (issue: layout
# freedom, item 2). One model, `strata zoo gpt` with 4 layers, hidden 256,
# 4 heads, seq 64, vocab 1024, batch 8, AdamW, on --mesh 2x1x1 with 4
# micro-batches, compiled with --zero 0, 1, 2, 3 and 3 --no-prefetch.
#   memory: `strata run`'s table after 3 steps (the plan's arena, the arena the
#           runner allocated, and what the device holds: weights and state).
#   time:   `strata run --steps 20`'s `steady` line (median step from the
#           third) on 2 threads and on 2 MPI ranks, every worker on one
#           thread; the configurations alternate over ROUNDS rounds and the
#           table gives the median.
# Usage: bench/run_zero.sh [build-dir]   (ROUNDS=3 by default)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
rounds="${ROUNDS:-3}"
ninja -C "$build" -j1 tools/strata >/dev/null
strata="$build/tools/strata"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "cores: $(nproc --all); $(uptime)"
"$strata" zoo gpt --layers 4 --hidden 256 --heads 4 --seq 64 --vocab 1024 --batch 8 \
  -o "$work/gpt.strata" >/dev/null
configs=(0 1 2 3 3n)
for z in "${configs[@]}"; do
  extra=()
  [[ $z == 3n ]] && extra=(--no-prefetch)
  "$strata" compile "$work/gpt.strata" --train --optimizer adamw:lr=1e-3 --mesh 2x1x1 \
    --microbatches 4 --zero "${z%n}" "${extra[@]}" -o "$work/z$z.splan" >/dev/null
done
label() { [[ $1 == 3n ]] && echo "3, --no-prefetch" || echo "$1"; }
steady() { grep '^steady' | awk '{print $2}'; }

echo
echo "Memory per device (device 0; 3 steps on 2 threads):"
echo
echo "| --zero | planned arena | allocated arena | weights + state |"
echo "|---|---:|---:|---:|"
for z in "${configs[@]}"; do
  row=$("$strata" run "$work/z$z.splan" --steps 3 | awk '/^device/ {getline; print; exit}')
  read -r _ _ _ _ _ planned pu allocated au held hu <<<"$row"
  echo "| $(label "$z") | $planned $pu | $allocated $au | $held $hu |"
done

declare -A threads ranks
for ((r = 1; r <= rounds; r++)); do
  for z in "${configs[@]}"; do
    threads[$z]+="$("$strata" run "$work/z$z.splan" --steps 20 | steady) "
    ranks[$z]+="$(mpirun --oversubscribe -np 2 "$strata" run "$work/z$z.splan" --steps 20 |
      steady | head -1) "
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
echo "Step time, ms (median of $rounds rounds; each round's figure in brackets):"
echo
echo "| --zero | 2 threads | 2 MPI ranks |"
echo "|---|---:|---:|"
for z in "${configs[@]}"; do
  echo "| $(label "$z") | $(median <<<"${threads[$z]}") (${threads[$z]% }) |" \
    "$(median <<<"${ranks[$z]}") (${ranks[$z]% }) |"
done
uptime
