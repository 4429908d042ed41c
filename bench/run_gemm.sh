#!/usr/bin/env bash
# Measures CPU sgemm: strata (bench/gemm_bench) against PyTorch and NumPy
# (bench/peers/torch_gemm.py) on the same shapes and thread counts, and writes
# bench/results/YYYY-MM-DD-gemm-cpu.md.
#
# Usage: bench/run_gemm.sh [build-dir]   (default: build; built here if needed)
# Env:   PASSES=n   run everything n times and keep each entry's best (default 2),
#                   which filters out interference from other work on the machine
#        MIN_TIME=s seconds per measurement and repetition (default 1)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-build}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
passes="${PASSES:-2}"
min_time="${MIN_TIME:-1}"
python=/usr/bin/python3 # Debian's, which has python3-torch
out="$root/bench/results/$(date +%F)-gemm-cpu.md"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

ninja -C "$build" bench/gemm_bench >/dev/null
bench_cmd=("$build/bench/gemm_bench" --benchmark_repetitions=3 --benchmark_min_time="$min_time"
  --benchmark_format=json)
peer_cmd=("$python" "$root/bench/peers/torch_gemm.py" --min-time "$min_time")

uptime >"$work/load_before"
for pass in $(seq 1 "$passes"); do
  echo "pass $pass/$passes: strata" >&2
  "${bench_cmd[@]}" --benchmark_out="$work/strata_$pass.json" >/dev/null
  echo "pass $pass/$passes: PyTorch and NumPy" >&2
  "${peer_cmd[@]}" >"$work/peers_$pass.tsv"
done
uptime >"$work/load_after"

"$python" - "$work" "$out" "$passes" "${bench_cmd[*]}" "${peer_cmd[*]}" <<'PY'
import datetime, glob, json, os, subprocess, sys

work, out, passes, bench_cmd, peer_cmd = sys.argv[1:6]

def lscpu(field):
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == field:
            return value.strip()
    return "?"

# strata: best GFLOP/s per (name, m, n, k, threads) over repetitions and passes.
strata = {}
for path in sorted(glob.glob(os.path.join(work, "strata_*.json"))):
    for b in json.load(open(path))["benchmarks"]:
        if b.get("run_type") != "iteration" or "FLOPS" not in b:
            continue
        parts = dict(p.split(":", 1) for p in b["run_name"].split("/")[1:] if ":" in p)
        threads = int(parts["threads"]) or os.cpu_count()
        key = (b["run_name"].split("/")[0], int(parts["m"]), int(parts["n"]), int(parts["k"]), threads)
        strata[key] = max(strata.get(key, 0.0), b["FLOPS"] / 1e9)

peers = {}
header = ""
for path in sorted(glob.glob(os.path.join(work, "peers_*.tsv"))):
    for line in open(path):
        if line.startswith("#"):
            header = line[1:].strip()
            continue
        lib, m, n, k, t, g = line.split("\t")
        key = (lib, int(m), int(n), int(k), int(t))
        peers[key] = max(peers.get(key, 0.0), float(g))

shapes = sorted({k[1:] for k in strata}, key=lambda s: (s[3], not s[0] == s[1] == s[2], s[0]))
def shape_name(m, n, k):
    return f"{m}^3" if m == n == k else f"{m}x{n}x{k} (GPT-2 MLP)"

lines = [
    f"# CPU sgemm: strata vs PyTorch ({datetime.date.today().isoformat()})",
    "",
    f"- Machine: {lscpu('Model name')}, {os.cpu_count()} cores "
    f"({lscpu('Thread(s) per core')} thread per core), flags include "
    f"{' '.join(f for f in ['avx2', 'avx512f', 'avx512_bf16'] if f in lscpu('Flags').split())}",
    f"- Peers: {header}",
    f"- Load before: `{open(os.path.join(work, 'load_before')).read().strip()}`",
    f"- Load after: `{open(os.path.join(work, 'load_after')).read().strip()}`",
    f"- Each figure is the best of {passes} passes x 3 repetitions (the machine is shared; "
    "the best run is the least disturbed one). GFLOP/s = 2*M*N*K / wall time per call.",
    "- Threads: strata sets both OpenBLAS (openblas_set_num_threads) and OpenMP "
    "(omp_set_num_threads, which oneDNN follows) through cpu::set_gemm_num_threads; the "
    "PyTorch script sets torch.set_num_threads and openblas_set_num_threads, because "
    "Debian's PyTorch 1.13 runs fp32 mm on the system OpenBLAS (BLAS_INFO=generic), whose "
    "thread pool torch.set_num_threads does not reach.",
    "",
    "Commands:",
    "",
    "```",
    f"{bench_cmd} --benchmark_out=...json",
    f"{peer_cmd}",
    "```",
    "",
    "## GFLOP/s",
    "",
    "| shape (MxNxK) | threads | strata sgemm (oneDNN) | strata sgemm (OpenBLAS) | strata MatMul op "
    "| PyTorch torch.mm | NumPy | strata MatMul / PyTorch |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
]
for threads in sorted({k[4] for k in strata}):
    for m, n, k, t in shapes:
        if t != threads:
            continue
        get = lambda d, name: d.get((name, m, n, k, threads))
        onednn, openblas, op = (get(strata, x) for x in ("BM_Sgemm_OneDnn", "BM_Sgemm_OpenBlas", "BM_MatMulOp"))
        torch_g, numpy_g = get(peers, "torch"), get(peers, "numpy")
        fmt = lambda v: f"{v:.1f}" if v else "-"
        ratio = f"{op / torch_g:.2f}" if op and torch_g else "-"
        lines.append(f"| {shape_name(m, n, k)} | {threads} | {fmt(onednn)} | {fmt(openblas)} | "
                     f"{fmt(op)} | {fmt(torch_g)} | {fmt(numpy_g)} | {ratio} |")
lines += [
    "",
    "The MatMul op runs strata's default GEMM backend (oneDNN dnnl_sgemm where oneDNN is "
    "built in). Target: strata >= 0.8x PyTorch at the same shape and thread count.",
    "",
]
open(out, "w").write("\n".join(lines))
print(out)
PY
