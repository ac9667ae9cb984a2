"""The float32 weights a DeepSpeed checkpoint stores for generation: the weights DeepSpeed trains, never a rounded
copy.

- float32 module (fp32 runs; bf16 through `torch_autocast`, what dalle_lab uses on the CPU): the module's parameters
  are the trained weights (below ZeRO-3 every rank holds them whole; ZeRO 1-2 copy the float32 partitions back
  into them exactly after each step).
- bf16/fp16 module (DeepSpeed's "bf16" or "fp16" sections: CUDA, or a user's config on the CPU): the module holds
  rounded copies; the float32 master weights live with the optimizer. ZeRO 1-3 and DeepSpeed's bf16 optimizer
  partition them across ranks (read with deepspeed.utils.safe_get_full_fp32_param); at ZeRO 0 DeepSpeed wraps the
  optimizer in FP16_Optimizer / FP16_UnfusedOptimizer, which keep a float32 copy of every parameter.
- ZeRO-3: parameters are partitioned, so each is gathered (its master weights, or the module values for a frozen
  one).

Parameters are gathered one at a time, a collective every rank joins in the same order; only rank 0 keeps them, so
it holds one float32 copy of the weights (the checkpoint's "model"), never another rank's optimizer state.
"""
from __future__ import annotations

import warnings

import torch


def float32_weights(engine, module, keep: bool) -> dict | None:
    """Collective. The transformer's float32 state dict (no VAE weights) on the rank with keep=True, None
    elsewhere."""
    masters = _zero0_masters(engine.optimizer)
    out, first_name = {}, {}
    for name, value in module.state_dict(keep_vars=True).items():
        if name.startswith("vae."):
            continue
        if id(value) in first_name:  # a tied weight (share_input_output_emb): gathered once, stored under both
            if keep:
                out[name] = out[first_name[id(value)]]
            continue
        first_name[id(value)] = name
        full = _full_float32(value, masters, name, type(engine.optimizer).__name__)
        if keep:
            out[name] = full.detach().cpu().clone() if full.is_floating_point() else full.detach().cpu()
    return out if keep else None


def _full_float32(value, masters: dict, name: str, optimizer_name: str) -> torch.Tensor:
    if not isinstance(value, torch.nn.Parameter):  # a buffer: never partitioned, never rounded by DeepSpeed
        return value.float() if value.is_floating_point() else value
    if value.dtype == torch.float32 and not hasattr(value, "ds_id"):
        return value
    from deepspeed.utils import safe_get_full_fp32_param

    full = safe_get_full_fp32_param(value)  # ZeRO 1-3, bf16 optimizer: this parameter's partitions gathered
    if full is None and id(value) in masters:
        full = masters[id(value)]
    if full is None and hasattr(value, "ds_id"):  # ZeRO-3, no optimizer state (frozen): the module's values
        import deepspeed

        with deepspeed.zero.GatheredParameters([value]):
            full = value.detach().float().clone()
    if full is None:
        warnings.warn(f"DeepSpeed keeps no float32 master copy of {name} that dalle_lab can read (optimizer "
                      f"{optimizer_name}); the checkpoint stores its {value.dtype} values widened to float32")
        full = value
    return full.float()


def _zero0_masters(optimizer) -> dict:
    """id(low-precision parameter) -> its float32 master, for DeepSpeed's ZeRO-0 fp16/bf16 optimizer wrappers
    (empty for every other optimizer). FP16_UnfusedOptimizer pairs fp16_groups[i][j] with fp32_groups[i][j];
    FP16_Optimizer (fused Adam) keeps each group flat, in the order of fp16_groups[i]."""
    masters = {}
    if hasattr(optimizer, "fp16_groups") and hasattr(optimizer, "fp32_groups"):
        for low_group, high_group in zip(optimizer.fp16_groups, optimizer.fp32_groups):
            masters.update({id(low): high for low, high in zip(low_group, high_group)})
    elif hasattr(optimizer, "fp16_groups") and hasattr(optimizer, "fp32_groups_flat"):
        for low_group, flat in zip(optimizer.fp16_groups, optimizer.fp32_groups_flat):
            offset = 0
            for low in low_group:
                masters[id(low)] = flat[offset:offset + low.numel()].view_as(low)
                offset += low.numel()
    return masters
