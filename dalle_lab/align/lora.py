"""LoRA adapters for the transformer's linear layers: train a low-rank update W + (alpha / r) * B @ A, base frozen.

With adapters switched off (`lora_disabled`) the model is exactly the starting model, which is what the KL penalty
compares against, so LoRA runs need no second copy of the transformer. B starts at zero, so a fresh adapter changes
nothing (the first policy-gradient ratios are exactly 1).
"""
from __future__ import annotations

import contextlib
import copy
import math

import torch
from torch import nn


class LoRALinear(nn.Module):
    """Wraps an nn.Linear; its `weight` / `bias` stay reachable so code that reads them keeps working."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base
        self.rank = rank
        self.scaling = alpha / rank
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, device=base.weight.device))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.enabled = True

    @property
    def weight(self):
        return self.base.weight

    @property
    def bias(self):
        return self.base.bias

    def forward(self, x):
        out = self.base(x)
        if self.enabled:
            out = out + (x @ self.lora_a.t().to(x.dtype)) @ self.lora_b.t().to(x.dtype) * self.scaling
        return out

    def merged_weight(self):
        return self.base.weight + self.scaling * (self.lora_b @ self.lora_a).to(self.base.weight.dtype)


def add_lora(model: nn.Module, rank: int, alpha: float = 16.0, skip=("vae",)) -> list[LoRALinear]:
    """Replace every nn.Linear of `model` (outside submodules named in `skip`, e.g. the frozen VAE) by a LoRALinear.
    Returns the adapters. Embeddings and norms are left alone."""
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    adapters = []
    targets = []
    for name, module in model.named_modules():
        if any(name == s or name.startswith(s + ".") for s in skip):
            continue
        for child_name, child in module.named_children():
            if isinstance(child, nn.Linear) and not isinstance(module, LoRALinear):
                targets.append((module, child_name, child))
    for parent, child_name, child in targets:
        adapter = LoRALinear(child, rank, alpha)
        setattr(parent, child_name, adapter)
        adapters.append(adapter)
    if not adapters:
        raise ValueError("add_lora found no nn.Linear layers to adapt in this model")
    return adapters


def lora_modules(model: nn.Module) -> list[LoRALinear]:
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for m in lora_modules(model) for p in (m.lora_a, m.lora_b)]


def lora_state_dict(model: nn.Module) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters() if ".lora_" in name}


@contextlib.contextmanager
def lora_disabled(model: nn.Module):
    """Run the model as the starting model (adapters bypassed)."""
    modules = lora_modules(model)
    previous = [m.enabled for m in modules]
    for m in modules:
        m.enabled = False
    try:
        yield model
    finally:
        for m, state in zip(modules, previous):
            m.enabled = state


def merged_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` with every adapter folded into a plain nn.Linear (same state-dict keys as before LoRA).
    The VAE, when attached as `model.vae`, is shared rather than copied."""
    vae = getattr(model, "vae", None)
    memo = {id(vae): vae} if vae is not None else {}
    merged = copy.deepcopy(model, memo)
    for module in list(merged.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                linear = child.base
                with torch.no_grad():
                    linear.weight.copy_(child.merged_weight())
                setattr(module, child_name, linear)
    return merged
