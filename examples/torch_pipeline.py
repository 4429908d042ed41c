#!/usr/bin/python3
"""Trains a PyTorch-defined model through strata on a 2-stage pipeline, and
the same model with PyTorch's own loop, side by side.

The module (an MLP) is exported through torch.onnx with strata.from_torch,
compiled into a training plan of two pipeline stages (two CPU device
threads, 4 micro-batches per step, 1F1B), and trained on the batches of a
PyTorch DataLoader. A copy of the module, from the same initial weights,
trains on the same batches with torch.optim.SGD. The script prints both
losses per step and their largest difference, then loads strata's trained
weights back into the module (load_state_dict(strict=True)) and compares
them with PyTorch's. It exits non-zero if the two runs disagree beyond
float32 rounding.

    scripts/build && PYTHONPATH=build/python /usr/bin/python3 examples/torch_pipeline.py
"""

import copy
import sys

import torch

import strata

STEPS = 20
BATCH = 32
FEATURES = 64
CLASSES = 10
LEARNING_RATE = 0.05


def make_data():
    """A fixed task a model can fit: labels from a random linear teacher."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS * BATCH, FEATURES, generator=generator)
    teacher = torch.randn(FEATURES, CLASSES, generator=generator)
    labels = (x @ teacher).argmax(dim=1)
    dataset = torch.utils.data.TensorDataset(x, labels)
    # A plan's shapes are fixed: every batch must be whole.
    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=False, drop_last=True)


def train_with_torch(net, loader):
    optimizer = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE)
    losses = []
    for x, labels in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def describe(plan):
    report = plan.inspect()
    pipeline = report["pipeline"]
    print(f"plan: {pipeline['stages']} stages x {pipeline['microbatches']} micro-batches, "
          f"{pipeline['schedule']}; predicted step {pipeline['predicted_step_s'] * 1e3:.3f} ms, "
          f"bubble {pipeline['predicted_bubble']:.1%}")
    for stage in report["stages"]:
        print(f"  device {stage['device']}: {stage['nodes']} nodes, "
              f"{stage['parameters']} parameters, peak activations {stage['arena_bytes']} B")
    for transfer in report["transfers"]:
        print(f"  {transfer['from']} -> {transfer['to']}: {transfer['tensor']}, "
              f"{transfer['bytes']} B x {transfer['count']}: {transfer['why']}")


def main():
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, CLASSES))
    reference = copy.deepcopy(net)
    loader = make_data()

    model = strata.from_torch(net, torch.zeros(BATCH, FEATURES))
    plan = model.compile(train=True, loss="softmax_cross_entropy",
                         optimizer=f"sgd:lr={LEARNING_RATE}", mesh="1x1x2", microbatches=4,
                         schedule="1f1b")
    describe(plan)
    with plan.trainer() as trainer:
        strata_losses = trainer.fit(loader)
        net.load_state_dict(trainer.state_dict(net), strict=True)

    torch_losses = train_with_torch(reference, loader)

    print("step  strata loss  PyTorch loss  difference")
    for step, (ours, theirs) in enumerate(zip(strata_losses, torch_losses), start=1):
        print(f"{step:4d}  {ours:11.6f}  {theirs:12.6f}  {ours - theirs:+.2e}")
    loss_gap = max(abs(a - b) for a, b in zip(strata_losses, torch_losses))
    weight_gap = max((a - b).abs().max().item()
                     for a, b in zip(net.state_dict().values(), reference.state_dict().values()))
    print(f"largest difference: loss {loss_gap:.2e}, weights {weight_gap:.2e}")
    return 0 if loss_gap < 1e-4 and weight_gap < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
