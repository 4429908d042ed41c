"""The two ceilings of the GPU at hand, measured through PyTorch, for
bench/run_cuda.sh to set its rows against (datasheet peaks are leads, not
what the card reaches): a large bf16 matrix product (TFLOP/s, random
operands: zeros run faster than real data) and a large device-to-device copy
(bytes read plus bytes written per second). Each is the median of 20 runs
timed with CUDA events after 3 warm-ups.

    python3 bench/peers/torch_ceilings.py
prints one line: "ceilings  bf16 GEMM <x> TFLOP/s  copy <y> TB/s (<device>)".
"""
import statistics

import torch


def median_ms(fn, repeats=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    gemm_ms = median_ms(lambda: torch.matmul(a, b, out=c))
    del a, b, c
    elements = 1 << 30  # 4 GiB of f32 each way
    src = torch.randn(elements, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src))
    tflops = 2 * n**3 / (gemm_ms * 1e-3) / 1e12
    tbps = 2 * src.numel() * src.element_size() / (copy_ms * 1e-3) / 1e12
    print(f"ceilings  bf16 GEMM {tflops:.0f} TFLOP/s  copy {tbps:.2f} TB/s "
          f"({torch.cuda.get_device_name()})")


if __name__ == "__main__":
    main()
