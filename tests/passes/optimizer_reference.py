#!/usr/bin/python3
# Reference numbers for tests/passes/optimizer_test.cc, from PyTorch 1.13
# (Debian's python3-torch: run with /usr/bin/python3). Two f32 parameters get
# a fixed gradient per step (the same values the C++ test feeds as graph
# inputs); the script prints the parameters after each of three steps.
import torch

torch.set_printoptions(precision=9)

W0 = [[0.5, -1.0, 0.25], [2.0, -0.75, 1.5]]
B0 = [0.1, -0.3, 0.2]


def grads(step):
    # Gradient of w and b at `step` (0-based); mirrors gradient_for() in the test.
    gw = [[((r * 3 + c) % 5 - 2) * 0.5 + 0.25 * step for c in range(3)] for r in range(2)]
    gb = [(c - 1) * 0.75 - 0.5 * step for c in range(3)]
    return torch.tensor(gw), torch.tensor(gb)


def run(name, make, clip=0.0):
    w = torch.tensor(W0, requires_grad=True)
    b = torch.tensor(B0, requires_grad=True)
    opt = make([w, b])
    print(name)
    for step in range(3):
        gw, gb = grads(step)
        w.grad, b.grad = gw.clone(), gb.clone()
        if clip > 0:
            # Clipping switches on where the norm passes `clip`: the norm must
            # clear it by far more than rounding, or strata and PyTorch could
            # disagree on whether to clip. (Here it is 2.15 .. 2.85.)
            norm = torch.cat([gw.flatten(), gb]).double().norm().item()
            assert abs(norm - clip) > 1e-3 * clip, f"step {step}: norm {norm} at the clip"
            torch.nn.utils.clip_grad_norm_([w, b], clip)
        opt.step()
        values = [f"{x:.9g}" for x in w.detach().flatten().tolist() + b.detach().tolist()]
        print(f"  step {step}: {{{', '.join(values)}}},")


run("sgd:lr=0.1,momentum=0.9,nesterov=1,wd=0.01",
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01))
run("adamw:lr=0.01,wd=0.1,beta1=0.9,beta2=0.95,eps=1e-8",
    lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1))
run("adam:lr=0.01,wd=0.05,clip=1",
    lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.05), clip=1.0)
