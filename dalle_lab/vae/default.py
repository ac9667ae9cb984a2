"""The default image tokenizer for the built-in Shapes data: shipped in dalle_lab/assets, or trained into the cache.

Reproduce the shipped files (docs/vae.md has how they were made and their measured quality):

    python train_vae.py --out_dir runs/shapes_vqgan     # VAETrainConfig defaults
    cp runs/shapes_vqgan/vqgan.ckpt dalle_lab/assets/shapes_vqgan.ckpt
    cp runs/shapes_vqgan/vqgan.yaml dalle_lab/assets/shapes_vqgan.yaml
"""
from __future__ import annotations

import os
from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "assets"
NAME = "shapes_vqgan"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir`, else $DALLE_LAB_CACHE, else ~/.cache/dalle_lab."""
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("DALLE_LAB_CACHE") or Path.home() / ".cache" / "dalle_lab")


def shipped_paths() -> tuple[Path, Path]:
    return ASSETS / f"{NAME}.ckpt", ASSETS / f"{NAME}.yaml"


def default_vae(cache_dir: str | os.PathLike | None = None):
    """The Shapes tokenizer (32 px -> 8x8 tokens): the shipped one, else a cached one, else train one (minutes)."""
    from .vqgan import VQGanVAE

    ckpt, yaml = shipped_paths()
    if ckpt.is_file() and yaml.is_file():
        return VQGanVAE(ckpt, yaml)
    cache = cache_root(cache_dir) / "vae"
    ckpt, yaml = cache / f"{NAME}.ckpt", cache / f"{NAME}.yaml"
    if not (ckpt.is_file() and yaml.is_file()):
        from .train import VAETrainConfig, export_tokenizer, train_vae

        print(f"[dalle_lab] no default image tokenizer in {ASSETS} or {cache}: training one (a few minutes)")
        config = VAETrainConfig(out_dir=str(cache / f"{NAME}_run"))
        metrics = train_vae(config)  # resumes if an earlier attempt was interrupted
        # writes the yaml, then the ckpt (atomically): only a finished export has both files
        export_tokenizer(config, metrics["last"], ckpt, yaml)
    return VQGanVAE(ckpt, yaml)
