#!/usr/bin/python3
"""The PyTorch side of bench/run_onnx.sh.

`export DIR`: writes resnet18.onnx, mobilenet_v2.onnx and gpt4.onnx (seed 0,
random weights) with the batch the benchmark uses.
`time NAME THREADS`: PyTorch 1.13's median inference time and median
training-step time (cross entropy, SGD) of the same model and batch on THREADS
threads, as "infer_ms train_ms".
"""
import math
import statistics
import sys
import time

import torch

BATCH, SEQ, VOCAB = 4, 64, 1024


class Gpt(torch.nn.Module):
    """A 4-layer GPT (hidden 256, 4 heads) with an additive causal mask."""

    def __init__(self, layers=4, hidden=256, heads=4):
        super().__init__()
        self.heads, self.hidden = heads, hidden
        self.wte = torch.nn.Embedding(VOCAB, hidden)
        self.wpe = torch.nn.Embedding(SEQ, hidden)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(torch.nn.ModuleDict(dict(
                ln1=torch.nn.LayerNorm(hidden), qkv=torch.nn.Linear(hidden, 3 * hidden),
                proj=torch.nn.Linear(hidden, hidden), ln2=torch.nn.LayerNorm(hidden),
                up=torch.nn.Linear(hidden, 4 * hidden), down=torch.nn.Linear(4 * hidden, hidden))))
        self.lnf = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, VOCAB, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((SEQ, SEQ), -1e9), diagonal=1))

    def forward(self, tokens):
        b, s = tokens.shape
        x = self.wte(tokens) + self.wpe(torch.arange(s))
        d = self.hidden // self.heads
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).split(self.hidden, dim=-1)
            q, k, v = (t.reshape(b, s, self.heads, d).transpose(1, 2) for t in (q, k, v))
            att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d) + self.mask, dim=-1)
            x = x + blk["proj"]((att @ v).transpose(1, 2).reshape(b, s, self.hidden))
            x = x + blk["down"](torch.nn.functional.gelu(blk["up"](blk["ln2"](x))))
        return self.head(self.lnf(x))


def model(name):
    torch.manual_seed(0)
    if name == "gpt4":
        return Gpt(), torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ))
    import torchvision
    m = getattr(torchvision.models, name)()
    return m, torch.randn(BATCH, 3, 224, 224), torch.randint(0, 1000, (BATCH,))


def median_ms(fn, min_time=2.0, min_reps=3):
    fn()  # warm up
    times, start = [], time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_time:
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    if sys.argv[1] == "export":
        for name in ("resnet18", "mobilenet_v2", "gpt4"):
            m, x, _ = model(name)
            m.eval()
            # Batch norm stays a node (not folded into the convolutions), so the
            # imported model trains the same layers PyTorch does.
            torch.onnx.export(m, (x,), f"{sys.argv[2]}/{name}.onnx", opset_version=13,
                              input_names=["input"], output_names=["output"],
                              training=torch.onnx.TrainingMode.PRESERVE,
                              do_constant_folding=False)
        return
    name, threads = sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(threads)
    m, x, labels = model(name)
    m.eval()  # inference; the training step below uses train mode
    with torch.no_grad():
        infer = median_ms(lambda: m(x))
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        out = m(x)
        loss = loss_fn(out.reshape(-1, out.shape[-1]), labels.reshape(-1))
        loss.backward()
        opt.step()

    print(f"{infer:.3f} {median_ms(step):.3f}")


main()
