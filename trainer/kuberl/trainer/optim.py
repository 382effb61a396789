"""Adam on torch's fused kernel, without `torch.optim`.

`torch.optim.Optimizer` imports `torch._dynamo` the first time one is built (its methods are wrapped to
keep `torch.compile` out of them): about 1 s of CPU here, on the critical path of every `kuberl train`
before its first update, and more while Ray starts beside it. The learner never compiles, so this class
drives the kernel `torch.optim.Adam(fused=True)` runs, `torch._fused_adam_`, itself: the same updates
bit for bit (tests/test_optim.py steps both side by side), and a `state_dict` in `torch.optim.Adam`'s
format, so checkpoints written with either load into both.
"""

from __future__ import annotations

from typing import Any

import torch

#: The group hyperparameters `torch.optim.Adam` writes into a state_dict, with the values used here.
_GROUP_DEFAULTS: dict[str, Any] = {
    "amsgrad": False, "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
    "fused": True, "decoupled_weight_decay": False,
}


def fused_adam_available() -> bool:
    return hasattr(torch, "_fused_adam_")


class FusedAdam:
    """Adam (L2 weight decay, no amsgrad) over one parameter group on CPU or CUDA.

    The subset of `torch.optim.Adam` the algorithms use: `param_groups[0]["lr"]` (read and annealed),
    `zero_grad`, `step`, `state_dict`, `load_state_dict`.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        self.params: list[torch.Tensor] = list(params)
        if not self.params:
            raise ValueError("FusedAdam got an empty parameter list")
        devices = {p.device.type for p in self.params}
        if not devices <= {"cpu", "cuda"}:
            raise ValueError(f"FusedAdam runs on cpu and cuda, not {sorted(devices)}")
        self.param_groups = [{"params": self.params, "lr": float(lr), "betas": (float(betas[0]), float(betas[1])),
                              "eps": float(eps), "weight_decay": float(weight_decay), **_GROUP_DEFAULTS}]
        # As torch.optim.Adam(fused=True) keeps it: a float32 step counter on the parameter's device.
        self.steps = [torch.zeros((), dtype=torch.float32, device=p.device) for p in self.params]
        self.exp_avgs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sqs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        by_device: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i, p in enumerate(self.params):
            if p.grad is not None:
                if p.grad.is_sparse:
                    raise RuntimeError("FusedAdam does not take sparse gradients")
                by_device.setdefault((p.device, p.dtype), []).append(i)
        for idx in by_device.values():
            steps = [self.steps[i] for i in idx]
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(
                [self.params[i] for i in idx], [self.params[i].grad for i in idx],
                [self.exp_avgs[i] for i in idx], [self.exp_avg_sqs[i] for i in idx], [], steps,
                amsgrad=False, lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
                eps=group["eps"], maximize=False, grad_scale=None, found_inf=None)

    # ---- torch.optim.Adam's state_dict format ------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        # Like torch.optim, no state for a parameter never stepped (its step count is still 0).
        state = {i: {"step": self.steps[i].clone(), "exp_avg": self.exp_avgs[i].clone(),
                     "exp_avg_sq": self.exp_avg_sqs[i].clone()}
                 for i in range(len(self.params)) if self.steps[i].item() > 0}
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self.params)))
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError(f"optimizer state has {[len(g['params']) for g in groups]} parameters in "
                             f"{len(groups)} group(s); this model has {len(self.params)} in one")
        saved = groups[0]
        if saved.get("amsgrad") or saved.get("maximize") or saved.get("decoupled_weight_decay"):
            raise ValueError("optimizer state uses amsgrad, maximize or decoupled weight decay, which FusedAdam "
                             "does not implement")
        for i, key in enumerate(saved["params"]):
            entry = state_dict["state"].get(key)
            p = self.params[i]
            if entry is None:
                self.steps[i].zero_()
                self.exp_avgs[i].zero_()
                self.exp_avg_sqs[i].zero_()
                continue
            for name, dest in (("exp_avg", self.exp_avgs), ("exp_avg_sq", self.exp_avg_sqs)):
                value = entry[name]
                if value.shape != p.shape:
                    raise ValueError(f"optimizer state {name} of parameter {i} has shape {tuple(value.shape)}, "
                                     f"the parameter {tuple(p.shape)}")
                dest[i] = value.detach().to(device=p.device, dtype=p.dtype).clone()
            self.steps[i] = torch.as_tensor(float(entry["step"]), dtype=torch.float32, device=p.device)
        group = self.param_groups[0]
        group["lr"] = float(saved["lr"])
        group["betas"] = (float(saved["betas"][0]), float(saved["betas"][1]))
        group["eps"] = float(saved["eps"])
        group["weight_decay"] = float(saved["weight_decay"])
