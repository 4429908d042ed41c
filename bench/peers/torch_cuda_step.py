"""PyTorch peer for bench/run_cuda.sh: one training step on a GPU of the same
models strata trains with `strata run --backend cuda`:
  - mlp: `strata zoo mlp --input 784 --hidden 256,256 --classes 10 --batch B`
    (Linear + ReLU layers), SGD(lr=0.01, momentum=0.9);
  - gpt: `strata zoo gpt --layers L --hidden H --heads NH --seq S --vocab V
    --batch B` (the mirror in torch_gpt_forward.py), SGD(lr=0.01, momentum=0.9);
  - convnet: `strata zoo convnet --batch B` (the mirror in torch_train_step.py),
    SGD(lr=0.01, momentum=0.9).
All in f32 with TF32 off (strata's default), loss = cross entropy.

Each step is timed with the GPU synchronized at its end (strata's trainer reads
the loss back every step), in three modes: eager; the whole step captured once
as a CUDA Graph and replayed (torch.cuda.graph, PyTorch's recipe for whole-step
capture); and torch.compile(mode="reduce-overhead") when --compile is given.

    python3 bench/peers/torch_cuda_step.py mlp --batch 32
    python3 bench/peers/torch_cuda_step.py gpt --layers 4 --hidden 512 --heads 8 --seq 256 --batch 8
Prints one line per mode: median ms per step and steps/s.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt_forward import Gpt  # noqa: E402
from torch_train_step import Convnet  # noqa: E402


def make(args):
    if args.model == "mlp":
        layers, width = [], args.input
        for h in args.hidden:
            layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
            width = h
        layers.append(torch.nn.Linear(width, args.classes))
        model = torch.nn.Sequential(*layers)
        x = torch.randn(args.batch, args.input)
        y = torch.randint(0, args.classes, (args.batch,))
    elif args.model == "gpt":
        model = Gpt(args.layers, args.hidden, args.heads, args.seq, args.vocab)
        x = torch.randint(0, args.vocab, (args.batch, args.seq))
        y = torch.randint(0, args.vocab, (args.batch, args.seq))
    else:
        model = Convnet()
        x = torch.randn(args.batch, 3, 32, 32)
        y = torch.randint(0, 10, (args.batch,))
    return model.cuda(), x.cuda(), y.cuda()


def timed(step, steps):
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model", choices=["mlp", "gpt", "convnet"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--input", type=int, default=784)
    parser.add_argument("--hidden", default=None,
                        help="mlp: widths, comma-separated (256,256); gpt: width (128)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--bf16", action="store_true",
                        help="mixed precision: the forward under torch.autocast(bfloat16)")
    args = parser.parse_args()
    if args.model == "gpt":
        args.hidden = int(args.hidden or 128)
    else:
        args.hidden = [int(v) for v in (args.hidden or "256,256").split(",")]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    loss_fn = torch.nn.CrossEntropyLoss()
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")

    def run(mode):
        model, x, y = make(args)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        forward = torch.compile(model, mode="reduce-overhead") if mode == "compile" else model

        def step():
            opt.zero_grad(set_to_none=False)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.bf16):
                logits = forward(x)
                loss = loss_fn(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            opt.step()
            return loss

        if mode != "graph":
            return timed(step, args.steps)
        # Whole-step capture after warm-up on a side stream (PyTorch's recipe).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return timed(graph.replay, args.steps)

    for mode in ["eager", "graph"] + (["compile"] if args.compile else []):
        seconds = run(mode)
        name = f"{args.model} bf16" if args.bf16 else args.model
        print(f"torch {name} {mode:8s} {seconds * 1e3:9.3f} ms/step {1 / seconds:10.1f} steps/s")


if __name__ == "__main__":
    main()
