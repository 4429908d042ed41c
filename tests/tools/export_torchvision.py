"""Exports torchvision's ResNet-18 and MobileNetV2 for OnnxTest.TorchvisionNetworksMatchTorch.

For each network, into the current folder:
  NAME.onnx, NAME.input.npy, NAME.output.npy, NAME.params
      eval mode at 224x224: strata's forward pass against PyTorch's.
  NAME.train.onnx, NAME.train.{input,target,loss}.npy, NAME.train.grad.P.npy,
  NAME.train.f32error
      one training step (batch norm on the batch's statistics) against
      PyTorch's gradients.

Why the gradient comparison cannot flip with rounding. A ReLU, a ReLU6 or a
max-pool window routes its output's gradient by a decision (x > 0, x < 6, which
element leads). Where the decision's input is within f32 rounding of its
boundary, another summation order takes the other side and a whole weight's
gradient jumps: ResNet-18 has a few such inputs among its millions, and which
side an f32 run lands on depends on the machine. So this script finds every
decision within K times PyTorch's own f32 error of its boundary ("ambiguous")
and chooses the MSE target so that the loss gradient reaching each ambiguous
decision is zero in f64. The gradient such a decision routes is then zero
whichever way it goes, and the two sides differ only by rounding. The script
checks that in f64 and fails if it does not hold.
"""
import copy
import sys

import numpy as np
import torch
import torch.nn.functional as F
import torchvision

# A decision closer to its boundary than K times the largest f32 error of its
# tensor is ambiguous (strata's f32 error is of the same order as PyTorch's).
K = 8
# The training step's image size: small enough that a few dozen decisions are
# ambiguous, large enough that no batch norm sees fewer than 8 values.
TRAIN_SIZE = 64
DECISIONS = (torch.nn.ReLU, torch.nn.ReLU6, torch.nn.MaxPool2d)


def export_eval(name, m):
    x = torch.randn(1, 3, 224, 224)
    torch.onnx.export(m, (x,), name + '.onnx', opset_version=13,
                      input_names=['input'], output_names=['output'])
    np.save(name + '.input.npy', x.numpy())
    with torch.no_grad():
        np.save(name + '.output.npy', m(x).numpy())
    with open(name + '.params', 'w') as f:
        f.write(str(sum(p.numel() for p in m.parameters())))


def boundary_distance(mod, x):
    """Each decision's distance from its boundary, in the shape of the output."""
    if isinstance(mod, torch.nn.MaxPool2d):
        k = mod.kernel_size
        cols = F.unfold(x, k, padding=mod.padding, stride=mod.stride)
        top = cols.view(x.shape[0], x.shape[1], k * k, -1).topk(2, dim=2).values
        # A window whose lead is 0 follows a ReLU that passes no gradient to
        # any of its elements: which one leads does not matter.
        lead = torch.where(top[:, :, 0] > 0, top[:, :, 0] - top[:, :, 1], float('inf'))
        side = (x.shape[2] + 2 * mod.padding - k) // mod.stride + 1
        return lead.view(x.shape[0], x.shape[1], side, -1)
    d = x.abs()
    return torch.minimum(d, (x - 6).abs()) if isinstance(mod, torch.nn.ReLU6) else d


def run_recorded(model, x, mkldnn=True):
    """The model's output and, per decision in call order, (module, input, output)."""
    seen = []
    hooks = [m.register_forward_hook(lambda mod, i, o: seen.append((mod, i[0], o)))
             for m in model.modules() if isinstance(m, DECISIONS)]
    with torch.backends.mkldnn.flags(enabled=mkldnn):
        y = model(x)
    for h in hooks:
        h.remove()
    return y, seen


def ambiguous_decisions(m32, m64, x):
    """Per decision (in f64): its output tensor and a mask of its ambiguous
    elements."""
    _, runs32 = run_recorded(m32, x.float())
    _, runs32b = run_recorded(m32, x.float(), mkldnn=False)
    y64, runs64 = run_recorded(m64, x)
    out = []
    for (mod, x64, o64), (_, xa, _), (_, xb, _) in zip(runs64, runs32, runs32b):
        noise = max(float((xa.double() - x64).abs().max()), float((xb.double() - x64).abs().max()))
        noise = max(noise, 1e-30)
        dist = boundary_distance(mod, x64.detach())
        out.append((o64, dist < K * noise))
    return y64, out


def neutral_target(m32, m64, x, target0):
    """The MSE target nearest target0 whose loss gradient is zero in f64 at
    every ambiguous decision; with the count of those decisions."""
    y64, decisions = ambiguous_decisions(m32, m64, x)
    residual = torch.zeros_like(y64, requires_grad=True)
    outputs = [o for o, mask in decisions if mask.any()]
    masks = [mask for _, mask in decisions if mask.any()]
    count = sum(int(mask.sum()) for mask in masks)
    r0 = (y64 - target0.double()).detach()
    if count == 0:
        return target0, 0
    # The gradient reaching the decisions is linear in the output's residual
    # y - t: one row per ambiguous decision (a second backward through the
    # first; rows of zeros where no gradient can reach), then r0 projected
    # onto the rows' null space.
    grads = torch.autograd.grad(y64, outputs, grad_outputs=residual, create_graph=True)
    picked = torch.cat([g[mask] for g, mask in zip(grads, masks)])
    rows = torch.stack([torch.autograd.grad(v, residual, retain_graph=True)[0].flatten()
                        for v in picked])
    r = (r0.flatten() - torch.linalg.pinv(rows) @ (rows @ r0.flatten())).view_as(r0)
    target = (y64 - r).detach().float()
    # Check in f64, with the target as saved in f32: the gradient at each
    # ambiguous decision is rounding against the largest gradient there.
    grads = torch.autograd.grad(y64, outputs, grad_outputs=y64.detach() - target.double())
    left = max(float(g[mask].abs().max()) for g, mask in zip(grads, masks))
    scale = max(float(g.abs().max()) for g in grads)
    assert left < 1e-5 * scale, 'ambiguous decisions still get gradient %g of %g' % (left, scale)
    return target, count


def gradients(model, x, t):
    model.zero_grad()
    loss = F.mse_loss(model(x), t)
    loss.backward()
    return loss.item(), {p: v.grad.clone() for p, v in model.named_parameters()}


def export_train(name, m):
    x = torch.randn(2, 3, TRAIN_SIZE, TRAIN_SIZE)
    torch.onnx.export(m, (x,), name + '.train.onnx', opset_version=13,
                      input_names=['input'], output_names=['output'],
                      training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)
    w0 = {p: v.detach().clone() for p, v in m.named_parameters()}
    m.train()
    for d in m.modules():
        if isinstance(d, torch.nn.Dropout):
            d.eval()
        if isinstance(d, (torch.nn.ReLU, torch.nn.ReLU6)):
            d.inplace = False  # the hooks read each decision's input
    m64 = copy.deepcopy(m).double()
    t, count = neutral_target(m, m64, x.double(), torch.randn(2, 1000))
    print('%s: %d decisions within %d f32 errors of their boundary get no gradient'
          % (name, count, K))
    np.save(name + '.train.input.npy', x.numpy())
    np.save(name + '.train.target.npy', t.numpy())
    loss, g32 = gradients(m, x, t)
    np.save(name + '.train.loss.npy', np.array([loss], np.float32))
    _, g64 = gradients(m64, x.double(), t.double())
    # Per parameter: PyTorch's f32 distance from f64 (deep nets' early layers
    # are ill-conditioned, and no f32 run gets closer), and the bound on the
    # rounding of w - g to f32 that reading a gradient back as w_before -
    # w_after adds (a batch norm's weight of 1 against a gradient of 1e-4).
    rel = lambda a, b: float((a.double() - b).abs().max() / b.abs().max())
    with open(name + '.train.f32error', 'w') as f:
        for p, w in g64.items():
            np.save(name + '.train.grad.' + p + '.npy', g32[p].numpy())
            after = (w0[p] - g32[p]).numpy()
            floor = float(np.spacing(np.abs(after)).max() / 2 / w.abs().max())
            f.write('%s %.9g %.9g\n' % (p, rel(g32[p], w), floor))


def main():
    for name in sys.argv[1:] or ['resnet18', 'mobilenet_v2']:
        torch.manual_seed(0)
        m = getattr(torchvision.models, name)().eval()
        export_eval(name, m)
        export_train(name, m)


if __name__ == '__main__':
    main()
