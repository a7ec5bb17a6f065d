"""AdamW golden (family "adamw"): torch.optim.AdamW's own updates, in float64, of a few parameters over
three steps, for tests/optimizer_test.cpp. Two parameter groups as nanoGPT makes them (matrices decay,
1-D tensors do not), a learning rate that changes every step (as a schedule does), and gradients drawn
per step. DIR/adamw/<case>/ holds init_<i>.npy, grad_<s>_<i>.npy, after_<s>_<i>.npy (float32 views of
the float64 run; parameter i after step s) and manifest.json (shapes, decay flags, the hyper-parameters
and the per-step learning rates)."""

import json
import os
from dataclasses import dataclass

import numpy as np
import torch

from golden_io import FamilyCases


@dataclass
class AdamWCase:
    name: str
    shapes: tuple          # one shape per parameter
    lrs: tuple             # the learning rate of each step
    betas: tuple = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    seed: int = 11


CASES = [AdamWCase("three_steps", shapes=((6, 5), (5,), (4, 1, 3), (7,)), lrs=(1e-2, 3e-2, 2e-2))]


def build_case(case: AdamWCase, case_dir: str) -> str:
    os.makedirs(case_dir, exist_ok=True)
    gen = torch.Generator().manual_seed(case.seed)
    # float32 starting values (what the engine holds), run in float64.
    params = [torch.randn(s, generator=gen, dtype=torch.float32).double().requires_grad_() for s in case.shapes]
    decay = [p.dim() >= 2 for p in params]
    opt = torch.optim.AdamW([{"params": [p for p, d in zip(params, decay) if d], "weight_decay": case.weight_decay},
                             {"params": [p for p, d in zip(params, decay) if not d], "weight_decay": 0.0}],
                            lr=case.lrs[0], betas=case.betas, eps=case.eps)
    save = lambda name, t: np.save(os.path.join(case_dir, name + ".npy"), t.detach().numpy().astype("<f4"))
    for i, p in enumerate(params):
        save(f"init_{i}", p)
    for s, lr in enumerate(case.lrs):
        for group in opt.param_groups:
            group["lr"] = lr
        for i, p in enumerate(params):
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float32).double()
            save(f"grad_{s}_{i}", p.grad)
        opt.step()
        for i, p in enumerate(params):
            save(f"after_{s}_{i}", p)
    manifest = {"case": case.name, "shapes": [list(s) for s in case.shapes], "decay": decay, "lrs": list(case.lrs),
                "beta1": case.betas[0], "beta2": case.betas[1], "eps": case.eps, "weight_decay": case.weight_decay,
                "torch": torch.__version__}
    with open(os.path.join(case_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    return f"{len(params)} parameters, {len(case.lrs)} steps of torch.optim.AdamW"


FAMILIES = [("adamw", FamilyCases(CASES, build_case))]
