"""PyTorch peer for bench/forward_bench's GPT: the same architecture and sizes
as `strata zoo gpt` (pre-LayerNorm blocks, fused qkv projection, causal mask
added before softmax, erf Gelu MLP, final LayerNorm, head tied to the token
embedding), timed in eval mode under torch.no_grad().

Run with Debian's python3 (/usr/bin/python3, which has python3-torch):
    /usr/bin/python3 bench/peers/torch_gpt_forward.py --threads 1
Prints one line per configuration with the median time of a forward pass and
the matmul GFLOP/s it implies. Compare times with strata's: both do the same work.
"""
import argparse
import ctypes
import ctypes.util
import math
import statistics
import time

import torch


def pin_threads(n):
    torch.set_num_threads(n)
    # Debian's torch runs fp32 matmul on the system OpenBLAS, whose pool
    # torch.set_num_threads does not reach.
    for name in ("openblas", "openblas64"):
        path = ctypes.util.find_library(name)
        if path:
            lib = ctypes.CDLL(path)
            if hasattr(lib, "openblas_set_num_threads"):
                lib.openblas_set_num_threads(n)


class Block(torch.nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.ln2 = torch.nn.LayerNorm(hidden)
        self.fc1 = torch.nn.Linear(hidden, 4 * hidden)
        self.fc2 = torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x, mask):
        b, s, h = x.shape
        hd = h // self.heads
        qkv = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd)) + mask
        context = torch.softmax(scores, dim=-1) @ v
        x = x + self.proj(context.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class Gpt(torch.nn.Module):
    def __init__(self, layers, hidden, heads, seq, vocab):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, hidden)
        self.wpe = torch.nn.Parameter(torch.randn(seq, hidden) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(hidden)
        mask = torch.triu(torch.full((seq, seq), -1e9), diagonal=1)
        self.register_buffer("mask", mask)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe
        for block in self.blocks:
            x = block(x, self.mask)
        return self.ln_f(x) @ self.wte.weight.t()


def matmul_flops(layers, hidden, seq, vocab, batch):
    tokens = batch * seq
    per_layer = 2 * tokens * 12 * hidden * hidden + 2 * 2 * batch * seq * seq * hidden
    return layers * per_layer + 2 * tokens * hidden * vocab


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min-time", type=float, default=1.0)
    args = parser.parse_args()
    pin_threads(args.threads)
    torch.manual_seed(0)
    layers, heads, vocab, batch = 2, 4, 512, 4
    for hidden, seq in [(128, 64), (256, 64), (512, 128)]:
        model = Gpt(layers, hidden, heads, seq, vocab).eval()
        tokens = torch.randint(0, vocab, (batch, seq))
        times = []
        with torch.no_grad():
            model(tokens)
            start = time.perf_counter()
            while time.perf_counter() - start < args.min_time or len(times) < 5:
                t0 = time.perf_counter()
                model(tokens)
                times.append(time.perf_counter() - t0)
        median = statistics.median(times)
        flops = matmul_flops(layers, hidden, seq, vocab, batch)
        print(f"gpt hidden={hidden} seq={seq} median_ms={median * 1e3:.3f} "
              f"matmul_gflops={flops / median / 1e9:.1f}")


if __name__ == "__main__":
    main()
