#!/usr/bin/python3
"""Writes the PyTorch training references that tests/runtime/torch_equivalence_test.cc
checks strata against.

For each zoo model (tools/zoo.cc: mlp, convnet, gpt, at small sizes) and each
optimizer (SGD with momentum and weight decay; AdamW), this builds the same model
in PyTorch, parameters held directly in strata's layout (a dense layer's weight is
[in, out] and computes x @ W + b, as zoo's Gemm/MatMul do; convolution weights are
[out, in, 3, 3] in both), runs 3 training steps of mean softmax cross entropy +
optimizer step on 3 seeded batches, and writes one .safetensors file
`<model>_<optimizer>.safetensors` beside this script holding:

  init/<name>   the parameters before the first step (strata names and layout)
  data/<input>  every strata training-graph input (including `labels`), the 3
                batches stacked along a new leading dimension
  loss          f32[3], the loss of each step (computed before its update)
  final/<name>  the parameters after the 3 steps

and, in __metadata__, the model, its zoo options and the strata optimizer string.

Run with Debian's PyTorch: /usr/bin/python3 tests/reference/make_training_references.py
The output is deterministic (CPU, fixed seeds, deterministic algorithms).
"""

import contextlib
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 3

# The zoo options of each model: the test builds strata's model from these.
MODELS = {
    "mlp": {"batch": 4, "input": 12, "hidden": [16, 16], "classes": 5},
    "convnet": {"batch": 2, "in_channels": 3, "image_size": 8, "channels": [4, 8],
                "fc_hidden": 16, "classes": 4},
    "gpt": {"layers": 2, "hidden": 16, "heads": 2, "seq": 8, "vocab": 32, "batch": 2},
}

# (strata optimizer string, torch optimizer factory) per name. torch.optim
# semantics are what strata's SgdUpdate/AdamUpdate follow (docs/ops.md).
def sgd():
    return ("sgd:lr=0.1,momentum=0.9,nesterov=0,wd=0.01",
            lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=False,
                                           weight_decay=0.01))


def adamw(eps=1e-8):
    return (f"adamw:lr=0.01,beta1=0.9,beta2=0.999,eps={eps!r},wd=0.1",
            lambda params: torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.999), eps=eps,
                                             weight_decay=0.1))


# The GPT's key bias (the middle third of layer<l>.attn.qkv.bias) has a gradient
# of exactly zero: it adds q.b_k to every score of a query's row, which Softmax
# cancels. In f32 its gradient is rounding noise (~3e-9 here, 1e-17 in f64), and
# Adam divides m by sqrt(v) + eps, turning that noise into steps of +-lr whose
# sign is arbitrary: any two f32 implementations (PyTorch f32 and f64 included)
# then disagree by ~lr. eps = 1e-4 keeps the noise's step below 1e-6 while real
# gradients (median 1e-3 .. 1e-2) still dominate the denominator.
OPTIMIZERS = {
    "mlp": {"sgd": sgd(), "adamw": adamw()},
    "convnet": {"sgd": sgd(), "adamw": adamw()},
    "gpt": {"sgd": sgd(), "adamw": adamw(eps=1e-4)},
}


# ---------------------------------------------------------------------------
# Parameters, in strata names and layout. Zoo initializes biases and LayerNorm
# bias to zero and LayerNorm scale to one; the references use small random values
# instead so every parameter's gradient path is exercised with non-trivial values.

def _normal(g, shape, std):
    return torch.randn(*shape, generator=g, dtype=torch.float64).float() * std


def mlp_params(o, g):
    p = {}
    width = o["input"]
    for i, h in enumerate(o["hidden"]):
        p[f"fc{i}.weight"] = _normal(g, (width, h), math.sqrt(2.0 / width))
        p[f"fc{i}.bias"] = _normal(g, (h,), 0.1)
        width = h
    p["head.weight"] = _normal(g, (width, o["classes"]), 1.0 / math.sqrt(width))
    p["head.bias"] = _normal(g, (o["classes"],), 0.1)
    return p


def convnet_params(o, g):
    p = {}
    c = o["in_channels"]
    for i, out in enumerate(o["channels"]):
        p[f"conv{i}.weight"] = _normal(g, (out, c, 3, 3), math.sqrt(2.0 / (c * 9)))
        p[f"conv{i}.bias"] = _normal(g, (out,), 0.1)
        c = out
    s = o["image_size"] >> len(o["channels"])
    width = c * s * s
    if o["fc_hidden"] > 0:
        p["fc.weight"] = _normal(g, (width, o["fc_hidden"]), math.sqrt(2.0 / width))
        p["fc.bias"] = _normal(g, (o["fc_hidden"],), 0.1)
        width = o["fc_hidden"]
    p["head.weight"] = _normal(g, (width, o["classes"]), 1.0 / math.sqrt(width))
    p["head.bias"] = _normal(g, (o["classes"],), 0.1)
    return p


def gpt_params(o, g):
    H, V, S = o["hidden"], o["vocab"], o["seq"]
    std = 0.2  # larger than zoo's 0.02 so attention and Gelu are far from linear
    p = {"wte": _normal(g, (V, H), std), "wpe": _normal(g, (S, H), std)}

    def ln(name):
        p[name + ".scale"] = 1.0 + _normal(g, (H,), 0.1)
        p[name + ".bias"] = _normal(g, (H,), 0.1)

    def linear(name, fan_in, fan_out):
        p[name + ".weight"] = _normal(g, (fan_in, fan_out), std)
        p[name + ".bias"] = _normal(g, (fan_out,), 0.1)

    for l in range(o["layers"]):
        ln(f"layer{l}.ln1")
        linear(f"layer{l}.attn.qkv", H, 3 * H)
        linear(f"layer{l}.attn.proj", H, H)
        ln(f"layer{l}.ln2")
        linear(f"layer{l}.mlp.fc1", H, 4 * H)
        linear(f"layer{l}.mlp.fc2", 4 * H, H)
    ln("ln_f")
    return p


# ---------------------------------------------------------------------------
# Forward passes, op for op as tools/zoo.cc builds them.

def mlp_forward(o, p, x):
    for i in range(len(o["hidden"])):
        x = torch.relu(x @ p[f"fc{i}.weight"] + p[f"fc{i}.bias"])  # Gemm + Relu
    return x @ p["head.weight"] + p["head.bias"]


def convnet_forward(o, p, x):
    for i in range(len(o["channels"])):
        x = F.conv2d(x, p[f"conv{i}.weight"], p[f"conv{i}.bias"], padding=1)
        x = F.max_pool2d(torch.relu(x), kernel_size=2, stride=2)
    x = torch.flatten(x, 1)
    if o["fc_hidden"] > 0:
        x = torch.relu(x @ p["fc.weight"] + p["fc.bias"])
    return x @ p["head.weight"] + p["head.bias"]


def gpt_forward(o, p, tokens):
    B, S, H, NH = o["batch"], o["seq"], o["hidden"], o["heads"]
    HD = H // NH
    dtype = p["wte"].dtype
    mask = torch.triu(torch.full((S, S), -1e9, dtype=torch.float32), diagonal=1).to(dtype)
    scale = torch.tensor(np.float32(1.0 / math.sqrt(HD)), dtype=torch.float32).to(dtype)

    def ln(x, name):
        return F.layer_norm(x, (H,), p[name + ".scale"], p[name + ".bias"], eps=1e-5)

    h = p["wte"][tokens] + p["wpe"]  # Gather + Add
    for l in range(o["layers"]):
        pre = f"layer{l}"
        x = ln(h, pre + ".ln1")
        qkv = x @ p[pre + ".attn.qkv.weight"] + p[pre + ".attn.qkv.bias"]
        qkv = qkv.reshape(B, S, 3, NH, HD).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = (q @ k.transpose(-1, -2)) * scale + mask
        probs = torch.softmax(scores, dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(B, S, H)
        h = h + (ctx @ p[pre + ".attn.proj.weight"] + p[pre + ".attn.proj.bias"])
        x = ln(h, pre + ".ln2")
        x = F.gelu(x @ p[pre + ".mlp.fc1.weight"] + p[pre + ".mlp.fc1.bias"], approximate="none")
        h = h + (x @ p[pre + ".mlp.fc2.weight"] + p[pre + ".mlp.fc2.bias"])
    h = ln(h, "ln_f")
    return h @ p["wte"].t()  # the head tied to the token embedding (MatMul trans_b)


# ---------------------------------------------------------------------------
# Data: strata's graph inputs, 3 batches stacked.

def make_data(model, o, g):
    if model == "mlp":
        x = torch.randn(STEPS, o["batch"], o["input"], generator=g, dtype=torch.float64).float()
        labels = torch.randint(0, o["classes"], (STEPS, o["batch"]), generator=g)
        return {"x": x, "labels": labels}, "x"
    if model == "convnet":
        n = o["image_size"]
        x = torch.randn(STEPS, o["batch"], o["in_channels"], n, n, generator=g,
                        dtype=torch.float64).float()
        labels = torch.randint(0, o["classes"], (STEPS, o["batch"]), generator=g)
        return {"image": x, "labels": labels}, "image"
    tokens = torch.randint(0, o["vocab"], (STEPS, o["batch"], o["seq"]), generator=g)
    labels = torch.randint(0, o["vocab"], (STEPS, o["batch"], o["seq"]), generator=g)
    return {"tokens": tokens, "labels": labels}, "tokens"


FORWARD = {"mlp": mlp_forward, "convnet": convnet_forward, "gpt": gpt_forward}
PARAMS = {"mlp": mlp_params, "convnet": convnet_params, "gpt": gpt_params}


def train(model, o, init, data, input_name, make_optimizer, dtype):
    params = {k: v.clone().to(dtype).requires_grad_(True) for k, v in init.items()}
    opt = make_optimizer(list(params.values()))
    losses = []
    for step in range(STEPS):
        x = data[input_name][step]
        if x.is_floating_point():
            x = x.to(dtype)
        logits = FORWARD[model](o, params, x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                               data["labels"][step].reshape(-1))  # mean over all labels
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach() for k, v in params.items()}


# ---------------------------------------------------------------------------
# Kinks. ReLU's gradient jumps at 0 and max pooling's where a window's two
# largest tie. Where an input sits within f32 rounding of such a point, strata's
# and PyTorch's summation orders could route a gradient differently and move a
# whole weight far beyond the test's tolerance; every such input, at every step,
# must clear its boundary by KINK_MARGIN times its f32-vs-f64 difference.
KINK_MARGIN = 30


@contextlib.contextmanager
def recording_kinks(seen):
    """torch.relu and F.max_pool2d append (input, distance to its kink) to `seen`."""
    relu, pool = torch.relu, F.max_pool2d

    def recorded_relu(x):
        seen.append((x.detach(), x.detach().abs()))
        return relu(x)

    def recorded_pool(x, **kwargs):
        top, where = pool(x, return_indices=True, **kwargs)
        rest = x.flatten(2).scatter(2, where.flatten(2), -math.inf).view_as(x)
        second = pool(rest, **kwargs)
        # Windows of ReLU outputs all 0 tie, but ReLU passes no gradient to any of them.
        gap = (top - second)[(top != 0) | (second != 0)]
        seen.append((x.detach(), gap.detach()))
        return pool(x, **kwargs)

    torch.relu, F.max_pool2d = recorded_relu, recorded_pool
    try:
        yield seen
    finally:
        torch.relu, F.max_pool2d = relu, pool


def kink_margin(seen32, seen64):
    """The smallest distance to a kink over the f32-vs-f64 difference of its input."""
    worst = math.inf
    for (x32, _), (x64, distance) in zip(seen32, seen64):
        noise = max((x32.double() - x64).abs().max().item(), 2.0 ** -24 * x64.abs().max().item())
        worst = min(worst, distance.min().item() / noise)
    return worst


# ---------------------------------------------------------------------------
# .safetensors writer: 8-byte LE header length, JSON header, raw data.

def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype == torch.float32:
            arr, dtype = t.contiguous().numpy().astype("<f4"), "F32"
        elif t.dtype == torch.int64:
            arr, dtype = t.contiguous().numpy().astype("<i8"), "I64"
        else:
            raise TypeError(f"{name}: unsupported dtype {t.dtype}")
        raw = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def options_metadata(model, o):
    meta = {"model": model}
    for k, v in o.items():
        meta[k] = ",".join(str(x) for x in v) if isinstance(v, list) else str(v)
    return meta


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    report = []
    for mi, (model, o) in enumerate(MODELS.items()):
        for oi, (opt_name, (opt_text, make_optimizer)) in enumerate(OPTIMIZERS[model].items()):
            g = torch.Generator().manual_seed(1000 + 10 * mi + oi)
            init = PARAMS[model](o, g)
            data, input_name = make_data(model, o, g)
            with recording_kinks([]) as kinks32:
                losses, final = train(model, o, init, data, input_name, make_optimizer,
                                      torch.float32)
            # The same run in f64: how far f32 rounding alone moves the results
            # (the noise floor any f32 implementation is compared within).
            with recording_kinks([]) as kinks64:
                losses64, final64 = train(model, o, init, data, input_name, make_optimizer,
                                          torch.float64)
            margin = kink_margin(kinks32, kinks64)
            assert margin >= KINK_MARGIN, f"{model}_{opt_name}: a kink within {margin:.1f}x noise"
            floor = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(losses, losses64))
            for k in final:
                scale = max(1.0, final64[k].abs().max().item())
                floor = max(floor, (final[k].double() - final64[k]).abs().max().item() / scale)
            # torch_equivalence_test.cc allows 1e-4: keep 10x of it for the
            # noise of another f32 implementation (Adam amplifies gradients near
            # 0 by up to lr/eps: see the GPT's eps above).
            assert floor < 1e-5, f"{model}_{opt_name}: f32-vs-f64 {floor:.2e}"

            tensors = {}
            for k, v in init.items():
                tensors["init/" + k] = v
            for k, v in final.items():
                tensors["final/" + k] = v.float()
            for k, v in data.items():
                tensors["data/" + k] = v
            tensors["loss"] = torch.tensor(losses, dtype=torch.float32)
            meta = options_metadata(model, o)
            meta.update({"optimizer": opt_text, "loss_fn": "softmax_cross_entropy",
                         "steps": str(STEPS), "torch": torch.__version__})
            path = os.path.join(HERE, f"{model}_{opt_name}.safetensors")
            write_safetensors(path, tensors, meta)
            report.append(f"{os.path.basename(path)}: {os.path.getsize(path)} bytes, "
                          f"loss {['%.6f' % l for l in losses]}, f32-vs-f64 {floor:.2e}, "
                          f"kinks {margin:.0f}x noise")
    print("\n".join(report))


if __name__ == "__main__":
    sys.exit(main())
