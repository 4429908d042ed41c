#!/usr/bin/env bash
# Communicator benchmarks (issue: multi-process execution); record the output
# under bench/results/.
#  1. The MPI link alone (mpi_alpha_beta): alpha and beta of a ping-pong, with
#     Open MPI set up as strata sets it (no single-copy transfers).
#  2. comm_bench: send/recv and the all-reduce of each algorithm the plans may
#     use (ring, tree, recursive doubling, Rabenseifner), 1 KiB to 256 MiB, on 2
#     and 4 devices, for the local communicator (threads; bound: spinning
#     threads and memcpy) and the MPI communicator (ranks; bound: alpha + n /
#     beta from 1, each algorithm's alpha-beta cost), beside MPI_Allreduce on
#     as many ranks (mpi_alpha_beta --allreduce, MPI alone).
#  3. A data-parallel training step: the same 2-replica plan as threads of one
#     process and as 2 MPI ranks, against the one-device plan.
#
# Usage: bench/run_comm.sh [build-dir]   (default: build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
ninja -C "$build" -j1 bench/comm_bench bench/mpi_alpha_beta tools/strata >/dev/null
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(mpirun --oversubscribe)
echo "cores: $(nproc --all); $(uptime)"
echo
link=$(OMPI_MCA_btl_vader_single_copy_mechanism=none "${mpirun[@]}" -np 2 "$build/bench/mpi_alpha_beta")
echo "MPI link (mpi_alpha_beta, 2 ranks): $link"
alpha=$(echo "$link" | awk '{print $2}')
beta=$(echo "$link" | awk '{print $5}')
for p in 2 4; do
  echo
  "$build/bench/comm_bench" --ranks "$p"
  echo
  "${mpirun[@]}" -np "$p" "$build/bench/comm_bench" --alpha "$alpha" --beta "$beta"
  echo
  OMPI_MCA_btl_vader_single_copy_mechanism=none "${mpirun[@]}" -np "$p" \
    "$build/bench/mpi_alpha_beta" --allreduce 256
done

echo
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
strata="$build/tools/strata"
"$strata" zoo gpt --layers 4 --hidden 256 --heads 4 --seq 64 --vocab 1024 --batch 8 \
  -o "$work/gpt.strata" >/dev/null
"$strata" compile "$work/gpt.strata" --train --optimizer adamw:lr=1e-3 -o "$work/one.splan" >/dev/null
"$strata" compile "$work/gpt.strata" --train --optimizer adamw:lr=1e-3 --mesh 2x1x1 \
  --microbatches 1 -o "$work/dp2.splan" >/dev/null
steps=20
rate() { grep '^done' | sed -E 's/.*\(([0-9.]+) steps\/s\).*/\1/'; }
one=$("$strata" run "$work/one.splan" --steps $steps | rate)
threads=$("$strata" run "$work/dp2.splan" --steps $steps | rate)
ranks=$("${mpirun[@]}" -np 2 "$strata" run "$work/dp2.splan" --steps $steps | rate)
echo "Data-parallel GPT step (4 layers, hidden 256, seq 64, batch 8, AdamW; $steps steps):"
echo "| run | steps/s | step time | vs one device |"
echo "|---|---:|---:|---:|"
for row in "one device (one.splan):$one" "2 replicas, threads:$threads" "2 replicas, 2 MPI ranks:$ranks"; do
  name="${row%%:*}"; r="${row##*:}"
  awk -v n="$name" -v r="$r" -v o="$one" \
    'BEGIN { printf "| %s | %.1f | %.1f ms | %.2f |\n", n, r, 1000 / r, o / r }'
done
uptime
