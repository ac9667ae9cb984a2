"""The image tokenizers shipped with the package (dalle_lab/assets/<dataset>_vqgan.{ckpt,yaml}): where they are,
and which one a checkpoint made on another machine recorded (found by its hash). A leaf below the VAE code, so both
the loader (vqgan.py) and the defaults (default.py) can use it without importing each other.
"""
from __future__ import annotations

from pathlib import Path

from dalle_lab.utils import file_sha256

from ..assets import ASSETS_DIR

SHIPPED_DATASETS = ("shapes", "emoji")


def shipped_paths(dataset: str = "shapes") -> tuple[Path, Path]:
    return ASSETS_DIR / f"{dataset}_vqgan.ckpt", ASSETS_DIR / f"{dataset}_vqgan.yaml"


def shipped_with_hash(sha256: str) -> tuple[Path, Path] | None:
    """(ckpt, yaml) of the shipped tokenizer whose checkpoint has this sha256, or None."""
    for dataset in SHIPPED_DATASETS:
        ckpt, yaml = shipped_paths(dataset)
        if ckpt.is_file() and file_sha256(ckpt) == sha256:
            return ckpt, yaml
    return None
