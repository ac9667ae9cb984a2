"""The default image tokenizer of each built-in dataset: shipped in dalle_lab/assets, or trained into the cache.

Reproduce a shipped pair (docs/vae.md has how they were made and their measured quality):

    python train_vae.py --out_dir runs/shapes_vqgan                    # VAETrainConfig defaults
    cp runs/shapes_vqgan/vqgan.ckpt dalle_lab/assets/shapes_vqgan.ckpt
    cp runs/shapes_vqgan/vqgan.yaml dalle_lab/assets/shapes_vqgan.yaml

and for dalle_lab/assets/emoji_vqgan.*: `python train_vae.py --data emoji --steps 3000 --out_dir runs/emoji_vqgan`.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..assets import ASSETS_DIR
from .shipped import shipped_paths
from .vqgan import VQGanVAE

# The train_vae.py settings (VAETrainConfig overrides) that produce each dataset's tokenizer.
RECIPES: dict[str, dict] = {
    "shapes": {},
    "emoji": {"data": "emoji", "steps": 3000},
}


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir`, else $DALLE_LAB_CACHE, else ~/.cache/dalle_lab."""
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("DALLE_LAB_CACHE") or Path.home() / ".cache" / "dalle_lab")


def default_vae(cache_dir: str | os.PathLike | None = None, dataset: str = "shapes"):
    """A built-in dataset's tokenizer (Shapes: 32 px -> 8x8 tokens): the shipped one, else a cached one, else
    train one with its recipe (minutes on a CPU)."""
    if dataset not in RECIPES:
        raise ValueError(f"no default image tokenizer for dataset {dataset!r} (have: {', '.join(RECIPES)}); "
                         "give --vqgan_model_path and --vqgan_config_path")
    ckpt, yaml = shipped_paths(dataset)
    if ckpt.is_file() and yaml.is_file():
        return VQGanVAE(ckpt, yaml)
    name = f"{dataset}_vqgan"
    cache = cache_root(cache_dir) / "vae"
    ckpt, yaml = cache / f"{name}.ckpt", cache / f"{name}.yaml"
    if not (ckpt.is_file() and yaml.is_file()):
        from .train import VAETrainConfig, export_tokenizer, train_vae  # only when nothing is shipped or cached

        print(f"[dalle_lab] no {dataset} image tokenizer in {ASSETS_DIR} or {cache}: training one (a few minutes)")
        config = VAETrainConfig(out_dir=str(cache / f"{name}_run"), **RECIPES[dataset])
        metrics = train_vae(config)  # resumes if an earlier attempt was interrupted
        # writes the yaml, then the ckpt (atomically): only a finished export has both files
        export_tokenizer(config, metrics["last"], ckpt, yaml)
    return VQGanVAE(ckpt, yaml)
