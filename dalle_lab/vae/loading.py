"""Rebuild the image tokenizer a checkpoint recorded, whatever its kind: a taming VQGAN (vqgan.py), DALLE-pytorch's
DiscreteVAE (discrete.py) or OpenAI's discrete VAE (openai.py). Each records its file paths and hash, never weights.
"""
from __future__ import annotations

from typing import Any, Mapping


def load_vae(identity_or_paths: Mapping[str, Any] | tuple | list, check_hash: bool = True):
    """The image tokenizer named by a checkpoint's `vae` identity (or a VQGAN's (model_path, config_path))."""
    if isinstance(identity_or_paths, Mapping):
        kind = identity_or_paths.get("kind")
        if kind == "dallepytorch_discrete_vae":
            from .discrete import load_discrete_vae

            return load_discrete_vae(identity_or_paths["path"], identity_or_paths.get("sha256") if check_hash else None)
        if kind == "openai_discrete_vae":
            from .openai import load_openai_vae

            return load_openai_vae(identity_or_paths, check_hash=check_hash)
    from .vqgan import load_vae as load_vqgan

    return load_vqgan(identity_or_paths, check_hash=check_hash)
