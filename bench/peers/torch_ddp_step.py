#!/usr/bin/python3
"""The PyTorch side of bench/run_dp.sh (issue 33: data parallelism that speeds
training up).

`export DIR`: writes mlp.onnx (MLP 784-512-256-10, batch 32), resnet18.onnx
(torchvision resnet18 without batch norm, 10 classes, 3x64x64 images, batch 2)
and widemlp.onnx (MLP 784-2048-2048-10, batch 256 or $WIDEMLP_BATCH: large
matrix products), seed 0, random weights, each
with its GLOBAL batch; the graph input is "input", the output "output". The
fourth model, gpt, is not exported (strata cannot split an imported
transformer for data parallelism yet; bench/run_dp.sh builds it with `strata
zoo gpt`): export prints its parameter count as "gpt parameters N" so the
caller can check that both sides build the same network.
  gpt  the mirror of `strata zoo gpt` (class Gpt of torch_gpt_forward.py):
       --layers 3 --hidden 256 --heads 4 --seq 128 --vocab 512, batch 8 or
       $GPT_BATCH (the compute-bound model: ~150-300 ms a training step on one
       thread), initialized as strata's zoo does (N(0, 0.02) weights, zero
       biases); random tokens in, random token labels, cross entropy over
       every token (logits [batch, seq, vocab] against labels [batch, seq]).
`time MODEL NPROC STEPS`: PyTorch 1.13's median training-step time (SGD lr 1e-2
without momentum, cross entropy; zero_grad + forward + backward + step) of that
model at its global batch split over NPROC processes of one thread each: NPROC
1 is one plain process; NPROC > 1 spawns NPROC processes that train a
DistributedDataParallel model (gloo on 127.0.0.1, default bucket_cap_mb; buffers
-- only gpt's constant causal mask -- not broadcast every step, as strata
keeps its mask in the model), each on global batch / NPROC. After warm-up steps
and a barrier, every step is timed; rank 0's median is printed as "torch MODEL
nproc=N median_ms=X".

Usage: bench/peers/torch_ddp_step.py export DIR
       bench/peers/torch_ddp_step.py time {mlp,resnet18,widemlp,gpt} NPROC STEPS
"""
import os

# One thread per process, set before torch loads (spawned children inherit it).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"
# Gloo on loopback only: the machine's other interfaces may lead nowhere.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import socket  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

CLASSES = 10
# `strata zoo gpt` sizes of the gpt model; bench/run_dp.sh passes the same.
GPT = {"layers": 3, "hidden": 256, "heads": 4, "seq": 128, "vocab": 512}
# name: (global batch, input dims per sample). WIDEMLP_BATCH (default 256) sizes
# the wide MLP's batch;
# GPT_BATCH (default 8) gpt's, in rows of GPT["seq"] tokens.
MODELS = {"mlp": (32, (784,)), "resnet18": (2, (3, 64, 64)),
          "widemlp": (int(os.environ.get("WIDEMLP_BATCH", "256")), (784,)),
          "gpt": (int(os.environ.get("GPT_BATCH", "8")), (GPT["seq"],))}
EXPORTED = ("mlp", "resnet18", "widemlp")
WARMUP = 3


def mlp(widths):
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])  # no ReLU after the classifier


def build(name):
    """The model with seed-0 weights."""
    torch.manual_seed(0)
    if name == "mlp":
        return mlp([784, 512, 256, CLASSES])
    if name == "widemlp":
        return mlp([784, 2048, 2048, CLASSES])
    if name == "gpt":
        from torch_gpt_forward import Gpt  # this file's folder is sys.path[0]
        m = Gpt(GPT["layers"], GPT["hidden"], GPT["heads"], GPT["seq"], GPT["vocab"])
        # strata's zoo initializer: weights and embeddings N(0, 0.02), biases 0,
        # LayerNorm 1 and 0 (as the mirror's). torch's defaults (an N(0, 1) token
        # embedding, tied to the head) would start at a loss of ~200 with
        # saturated softmaxes, whose underflowing probabilities are denormal
        # floats that can slow the CPU's arithmetic: the two sides would not do
        # the same work.
        with torch.no_grad():
            for module in m.modules():
                if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                    module.weight.normal_(0.0, 0.02)
                if isinstance(module, torch.nn.Linear):
                    module.bias.zero_()
        return m
    import torchvision
    # Without batch norm: strata refuses to split a batch-norm node's batch
    # over replicas (each would normalize with its own statistics, as DDP
    # without SyncBatchNorm does), so both sides train the same network
    # without it.
    return torchvision.models.resnet18(num_classes=CLASSES,
                                       norm_layer=lambda channels: torch.nn.Identity())


def batch(name, size, seed):
    g = torch.Generator().manual_seed(seed)
    dims = MODELS[name][1]
    if name == "gpt":  # token ids in, the next-token labels random too
        return (torch.randint(0, GPT["vocab"], (size,) + dims, generator=g),
                torch.randint(0, GPT["vocab"], (size,) + dims, generator=g))
    return torch.randn((size,) + dims, generator=g), torch.randint(0, CLASSES, (size,), generator=g)


def export(folder):
    for name in EXPORTED:
        global_batch = MODELS[name][0]
        m = build(name)
        m.eval()
        x, _ = batch(name, global_batch, 0)
        torch.onnx.export(m, (x,), os.path.join(folder, f"{name}.onnx"), opset_version=13,
                          input_names=["input"], output_names=["output"],
                          training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)
    print(f"gpt parameters {sum(p.numel() for p in build('gpt').parameters())}", flush=True)


def step_times(m, x, labels, steps, barrier=None):
    """Per-step milliseconds of `steps` SGD steps after WARMUP untimed ones."""
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=1e-2)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        logits = m(x)  # gpt: [batch, seq, vocab], a class per token
        loss_fn(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)).backward()
        opt.step()

    for _ in range(WARMUP):
        step()
    if barrier:
        barrier()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def worker(rank, nproc, port, name, steps, results):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=nproc)
    try:
        global_batch = MODELS[name][0]
        # Every rank starts from the same weights (DDP also broadcasts rank 0's).
        model = torch.nn.parallel.DistributedDataParallel(build(name), broadcast_buffers=False)
        x, labels = batch(name, global_batch // nproc, 1 + rank)
        times = step_times(model, x, labels, steps, barrier=dist.barrier)
        dist.barrier()
        if rank == 0:
            results.put(statistics.median(times))
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median_step_ms(name, nproc, steps):
    global_batch = MODELS[name][0]
    if global_batch % nproc:
        raise SystemExit(f"{name}: global batch {global_batch} does not split over {nproc} "
                         "processes")
    if nproc == 1:
        torch.set_num_threads(1)
        x, labels = batch(name, global_batch, 1)
        return statistics.median(step_times(build(name), x, labels, steps))
    import torch.multiprocessing as mp
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(nproc, free_port(), name, steps, results), nprocs=nproc, join=True)
    return results.get()


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "export":
        export(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "time" and sys.argv[2] in MODELS:
        name, nproc, steps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        print(f"torch {name} nproc={nproc} median_ms={median_step_ms(name, nproc, steps):.3f}",
              flush=True)
    else:
        raise SystemExit(__doc__.split("\n\n")[-1])


if __name__ == "__main__":
    main()
