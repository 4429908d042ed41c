"""PyTorch peer for bench/train_bench: one training step (zero_grad + forward +
cross-entropy loss + backward + optimizer step) of the same models and sizes as
the strata benchmark:
  - the 2-layer GPT of `strata zoo gpt` (the mirror in torch_gpt_forward.py),
    4 heads, vocab 512, batch 4, (hidden, seq) in {(128, 64), (256, 64)},
    loss = cross-entropy of the logits [batch, seq, vocab] against token labels;
  - the convnet of `strata zoo convnet` at its defaults (3x32x32 images,
    Conv2d 3x3 pad 1 + ReLU + MaxPool 2x2 per stage with 16 and 32 channels,
    Flatten, Linear 2048->128 + ReLU, Linear 128->10), batch 8 and 32.
Optimizers as in strata: AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
weight_decay=0) -- strata's "adamw:lr=1e-3,wd=0" (bench/train_bench.cc) -- and, for the
convnet, SGD(lr=1e-2) without momentum.

Run with Debian's python3 (/usr/bin/python3, which has python3-torch):
    /usr/bin/python3 bench/peers/torch_train_step.py --threads 1
Prints one line per configuration with the median time of a training step.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt_forward import Gpt, pin_threads  # noqa: E402


class Convnet(torch.nn.Module):
    """zoo::make_convnet: (Conv2d 3x3 pad 1 + Relu + MaxPool2d 2x2) per stage,
    Flatten, Gemm + Relu (fc_hidden), Gemm (classes)."""

    def __init__(self, in_channels=3, image_size=32, channels=(16, 32), fc_hidden=128,
                 classes=10):
        super().__init__()
        layers = []
        c = in_channels
        for out in channels:
            layers += [torch.nn.Conv2d(c, out, 3, padding=1), torch.nn.ReLU(),
                       torch.nn.MaxPool2d(2, 2)]
            c = out
        s = image_size >> len(channels)
        layers += [torch.nn.Flatten(1), torch.nn.Linear(c * s * s, fc_hidden), torch.nn.ReLU(),
                   torch.nn.Linear(fc_hidden, classes)]
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def time_steps(model, inputs, labels, optimizer, min_time):
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        optimizer.zero_grad()
        logits = model(inputs)
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(3):  # warm-up: allocator, optimizer state
        step()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_time or len(times) < 5:
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make_optimizer(name, params):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    return torch.optim.SGD(params, lr=1e-2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min-time", type=float, default=1.0)
    args = parser.parse_args()
    pin_threads(args.threads)
    torch.manual_seed(0)

    layers, heads, vocab, batch = 2, 4, 512, 4
    for hidden, seq in [(128, 64), (256, 64)]:
        model = Gpt(layers, hidden, heads, seq, vocab).train()
        tokens = torch.randint(0, vocab, (batch, seq))
        labels = torch.randint(0, vocab, (batch, seq))
        median = time_steps(model, tokens, labels, make_optimizer("adamw", model.parameters()),
                            args.min_time)
        print(f"gpt_train hidden={hidden} seq={seq} optimizer=adamw median_ms={median * 1e3:.3f}")

    for optimizer in ("adamw", "sgd"):
        for batch in (8, 32):
            model = Convnet().train()
            images = torch.randn(batch, 3, 32, 32)
            labels = torch.randint(0, 10, (batch,))
            median = time_steps(model, images, labels,
                                make_optimizer(optimizer, model.parameters()), args.min_time)
            print(f"convnet_train batch={batch} optimizer={optimizer} "
                  f"median_ms={median * 1e3:.3f}")


if __name__ == "__main__":
    main()
