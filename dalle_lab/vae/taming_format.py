"""Reading and writing taming-transformers' published file format: an OmegaConf yaml + a Lightning-style .ckpt.

A published VQGAN is two files:

- `model.yaml`: `model: {target: taming.models.vqgan.VQModel | GumbelVQ, params: {n_embed, embed_dim, ddconfig,
  lossconfig, ...}}` (plus a `data:` section we ignore);
- `last.ckpt`: a dict whose `state_dict` holds the model weights, including the training loss's weights under
  `loss.` (LPIPS + discriminator), and other Lightning bookkeeping we ignore.

This module builds the taming model from the yaml *without* its training loss (the loss needs LPIPS/VGG weights
that cannot be downloaded here, and inference never uses it) and loads the weights strictly.
"""
from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

SUPPORTED_TARGETS = {
    "taming.models.vqgan.VQModel": "VQModel",
    "taming.models.vqgan.GumbelVQ": "GumbelVQ",
}
# The training loss (LPIPS + patch discriminator) is stored under this prefix in published checkpoints.
LOSS_PREFIX = "loss."
# What our own yaml files name as the loss: taming's no-op loss, never instantiated by dalle_lab.
NO_LOSS = {"target": "taming.modules.losses.vqperceptual.DummyLoss"}


def read_model_config(config_path: str | os.PathLike) -> dict[str, Any]:
    """The `model` section of a taming yaml as a plain dict with `target` and `params`, validated."""
    from omegaconf import OmegaConf

    config_path = Path(config_path)
    if not config_path.is_file():
        raise FileNotFoundError(f"VQGAN config not found: {config_path}")
    config = OmegaConf.to_container(OmegaConf.load(config_path), resolve=True)
    model = config.get("model", config) if isinstance(config, dict) else None
    if not isinstance(model, dict) or "target" not in model or "params" not in model:
        raise ValueError(
            f"{config_path} is not a taming-transformers model config: expected a `model:` section with `target:` "
            "and `params:` (the .yaml published next to the VQGAN .ckpt)"
        )
    if model["target"] not in SUPPORTED_TARGETS:
        raise ValueError(
            f"{config_path} names model target {model['target']!r}; dalle_lab loads only "
            f"{sorted(SUPPORTED_TARGETS)}"
        )
    params = model["params"]
    for key in ("n_embed", "embed_dim", "ddconfig"):
        if key not in params:
            raise ValueError(f"{config_path}: model.params has no {key!r}; is this a VQGAN config?")
    if model["target"].endswith("GumbelVQ") and params["embed_dim"] != params["ddconfig"]["z_channels"]:
        # taming's GumbelVQ projects quant_conv's output (embed_dim channels) with a conv built for z_channels
        raise ValueError(f"{config_path}: a GumbelVQ needs embed_dim == ddconfig.z_channels (taming's layout)")
    if params.get("remap") is not None:
        raise ValueError(f"{config_path}: codebook remapping (model.params.remap) is not supported by dalle_lab")
    return model


def fmap_size(ddconfig: dict[str, Any]) -> int:
    """Side of the token grid: the encoder halves the resolution once per ch_mult level after the first."""
    return int(ddconfig["resolution"]) // 2 ** (len(ddconfig["ch_mult"]) - 1)


def build_model(model_config: dict[str, Any]):
    """Instantiate the taming class named by `model_config` with random weights and no training loss."""
    from .taming_compat import import_taming

    vqgan = import_taming()
    cls = getattr(vqgan, SUPPORTED_TARGETS[model_config["target"]])
    params = dict(model_config["params"])
    # ckpt_path would make taming load weights itself with strict=False; we load strictly afterwards instead.
    params.pop("ckpt_path", None)
    params.pop("ignore_keys", None)
    # torch.nn.Identity has no weights, so the model's state_dict is exactly the inference weights.
    params["lossconfig"] = {"target": "torch.nn.Identity"}
    with contextlib.redirect_stdout(io.StringIO()):  # taming prints the latent shape on every construction
        return cls(**params)


def read_state_dict(ckpt_path: str | os.PathLike, trust_pickle: bool = False) -> dict[str, Any]:
    """The `state_dict` of a taming/Lightning checkpoint, minus the training loss's weights."""
    import pickle

    import torch

    ckpt_path = Path(ckpt_path)
    if not ckpt_path.is_file():
        raise FileNotFoundError(f"VQGAN checkpoint not found: {ckpt_path}")
    try:
        checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as error:
        raise ValueError(
            f"{ckpt_path} holds pickled Python objects besides tensors, so it was not loaded with "
            "weights_only=True. If you trust this file, pass trust_pickle=True (or --vqgan_trust_pickle), "
            f"which runs its pickle code. Detail: {error}"
        ) from error
    except Exception as error:  # noqa: BLE001 - a truncated or non-torch file: say which one
        raise ValueError(f"could not read VQGAN checkpoint {ckpt_path}: {error}") from error
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ValueError(
            f"{ckpt_path} is not a taming-transformers checkpoint: expected a dict with a 'state_dict' entry"
        )
    return {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith(LOSS_PREFIX)}


def load_weights_strictly(model, state_dict: dict[str, Any], ckpt_path, config_path) -> None:
    """load_state_dict(strict=True), but a mismatch names both files and lists what differs."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    reshaped = sorted(
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs config {tuple(expected[k].shape)}"
        for k in set(expected) & set(state_dict)
        if tuple(state_dict[k].shape) != tuple(expected[k].shape)
    )
    if missing or unexpected or reshaped:

        def first(items):
            return ", ".join(items[:5]) + (f" (+{len(items) - 5} more)" if len(items) > 5 else "")

        problems = []
        if reshaped:
            problems.append(f"{len(reshaped)} shape mismatches [{first(reshaped)}]")
        if missing:
            problems.append(f"{len(missing)} weights missing from the checkpoint [{first(missing)}]")
        if unexpected:
            problems.append(f"{len(unexpected)} unexpected weights in the checkpoint [{first(unexpected)}]")
        raise ValueError(
            f"VQGAN checkpoint {ckpt_path} does not match config {config_path}: " + "; ".join(problems)
            + ". Use the .yaml published together with this .ckpt."
        )
    model.load_state_dict(state_dict, strict=True)


def write_config(model_config: dict[str, Any], config_path: str | os.PathLike) -> Path:
    """Write `{model: model_config}` as a taming yaml (atomically)."""
    from omegaconf import OmegaConf

    from ..utils import atomic_write

    text = OmegaConf.to_yaml(OmegaConf.create({"model": model_config}))
    return atomic_write(config_path, lambda tmp: Path(tmp).write_text(text))


def write_checkpoint(model, ckpt_path: str | os.PathLike, half: bool = False, **extra: Any) -> Path:
    """Write `{"state_dict": ..., **extra}` (taming's format) atomically; `half` stores float weights as fp16."""
    import torch

    from ..utils import atomic_torch_save

    state = {
        k: (v.detach().to("cpu", torch.float16) if half and v.is_floating_point() else v.detach().cpu())
        for k, v in model.state_dict().items()
    }
    return atomic_torch_save({"state_dict": state, **extra}, ckpt_path)
