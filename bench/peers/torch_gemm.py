#!/usr/bin/python3
"""sgemm throughput of PyTorch (torch.mm) and NumPy (np.matmul) on the shapes of
bench/gemm_bench.cc, at one thread and at one thread per core.

Run with Debian's interpreter, /usr/bin/python3 (python3-torch). Debian's
PyTorch and NumPy both call the system BLAS (OpenBLAS, pthreads build), whose
thread pool torch.set_num_threads does not reach, so the thread count is set in
both places: torch.set_num_threads and openblas_set_num_threads (via ctypes).

Prints one line per measurement:
  library<TAB>m<TAB>n<TAB>k<TAB>threads<TAB>GFLOP/s
GFLOP/s = 2*m*n*k / mean seconds per call, best of 3 repetitions of at least
--min-time seconds each (what gemm_bench does with --benchmark_repetitions=3).
"""
import argparse
import ctypes
import ctypes.util
import os
import time

import numpy as np
import torch

SHAPES = [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (2048, 3072, 768)]


def openblas_setter():
    for name in ("libopenblas.so.0", ctypes.util.find_library("openblas")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            return lib.openblas_set_num_threads
        except (OSError, AttributeError):
            continue
    return None


def measure(call, min_time):
    call()  # warm up
    best = float("inf")
    for _ in range(3):
        count = 0
        start = time.perf_counter()
        while True:
            call()
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        best = min(best, elapsed / count)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-time", type=float, default=1.0)
    parser.add_argument("--threads", type=int, nargs="*", default=[1, os.cpu_count()])
    args = parser.parse_args()
    set_blas_threads = openblas_setter()
    print(f"# torch {torch.__version__}, numpy {np.__version__}, "
          f"openblas_set_num_threads {'found' if set_blas_threads else 'NOT found'}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        if set_blas_threads:
            set_blas_threads(threads)
        for m, n, k in SHAPES:
            gen = torch.Generator().manual_seed(0)
            a = torch.rand(m, k, generator=gen) * 2 - 1
            b = torch.rand(k, n, generator=gen) * 2 - 1
            c = torch.empty(m, n)
            seconds = measure(lambda: torch.mm(a, b, out=c), args.min_time)
            print(f"torch\t{m}\t{n}\t{k}\t{threads}\t{2 * m * n * k / seconds / 1e9:.1f}", flush=True)
            an, bn = a.numpy(), b.numpy()
            cn = np.empty((m, n), dtype=np.float32)
            seconds = measure(lambda: np.matmul(an, bn, out=cn), args.min_time)
            print(f"numpy\t{m}\t{n}\t{k}\t{threads}\t{2 * m * n * k / seconds / 1e9:.1f}", flush=True)


if __name__ == "__main__":
    main()
