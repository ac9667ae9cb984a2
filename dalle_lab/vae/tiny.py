"""Tiny random taming VQGANs written in the published format: a test fixture for every module that needs a VAE."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import taming_format


def tiny_model_config(gumbel: bool = False, image_size: int = 32, n_embed: int = 64) -> dict[str, Any]:
    """A taming `model:` config small enough for unit tests: 4x downsampling (32 px -> 8x8 tokens), ~0.2M params."""
    ddconfig = {
        "double_z": False,
        "z_channels": 32,
        "resolution": image_size,
        "in_channels": 3,
        "out_ch": 3,
        "ch": 32,  # taming's GroupNorm uses 32 groups: channel counts must be multiples of 32
        "ch_mult": [1, 1, 1],
        "num_res_blocks": 1,
        "attn_resolutions": [],
        "dropout": 0.0,
    }
    params: dict[str, Any] = {
        "embed_dim": 16,
        "n_embed": n_embed,
        "ddconfig": ddconfig,
        "lossconfig": dict(taming_format.NO_LOSS),
    }
    if gumbel:
        params["embed_dim"] = ddconfig["z_channels"]  # taming's GumbelVQ feeds quant_conv's output to the quantizer
        params["kl_weight"] = 1e-8
        params["temperature_scheduler_config"] = {
            "target": "taming.lr_scheduler.LambdaWarmUpCosineScheduler",
            "params": {"warm_up_steps": 0, "max_decay_steps": 1000, "lr_start": 0.9, "lr_max": 0.9, "lr_min": 1e-6},
        }
    target = "taming.models.vqgan.GumbelVQ" if gumbel else "taming.models.vqgan.VQModel"
    return {"base_learning_rate": 4.5e-6, "target": target, "params": params}


def make_tiny_vqgan(directory: str | os.PathLike, gumbel: bool = False, image_size: int = 32, n_embed: int = 64,
                    seed: int = 0) -> tuple[Path, Path]:
    """Write `tiny_vqgan.ckpt` + `tiny_vqgan.yaml` (random weights) into `directory`; return (ckpt, yaml).

    Like a published checkpoint, the .ckpt also carries Lightning bookkeeping and training-loss weights under
    `loss.`, which loaders must ignore.
    """
    import torch

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = "tiny_gumbel" if gumbel else "tiny_vqgan"
    config = tiny_model_config(gumbel=gumbel, image_size=image_size, n_embed=n_embed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = taming_format.build_model(config)
        # Spread the codebook out so that random encoders still use several codes (taming initialises it to
        # +-1/n_embed, which a random encoder output maps to almost one code).
        codebook = model.quantize.embed.weight if gumbel else model.quantize.embedding.weight
        codebook.data.normal_()
        fake_loss_weights = {"loss.discriminator.main.0.weight": torch.randn(4, 3, 4, 4), "loss.logvar": torch.zeros(())}
    yaml_path = taming_format.write_config(config, directory / f"{name}.yaml")
    ckpt_path = taming_format.write_checkpoint(model, directory / f"{name}.ckpt", epoch=0, global_step=0)
    # add the published checkpoints' loss weights after the fact (our model has none)
    checkpoint = torch.load(ckpt_path, weights_only=True)
    checkpoint["state_dict"].update(fake_loss_weights)
    from ..utils import atomic_torch_save

    atomic_torch_save(checkpoint, ckpt_path)
    return ckpt_path, yaml_path
