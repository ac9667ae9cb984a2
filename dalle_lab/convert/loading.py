"""load_dalle: a DALLE ready for generation from either checkpoint format, dalle_lab's or DALLE-pytorch's (the
latter converted in memory, with a one-line note)."""
from __future__ import annotations

import os
import sys

import torch

from dalle_lab.training.checkpoint import load_dalle as load_native

from .convert import Sources, load_dallepytorch
from .dallepytorch import is_dallepytorch_checkpoint


def load_dalle(path: str | os.PathLike, device="cpu", bpe_path=None, vqgan_paths=None, *, hug: bool = False,
               openai_paths=None, note=None):
    """(dalle, tokenizer, vae) in eval mode on `device`.

    A dalle_lab checkpoint records its tokenizers; bpe_path / vqgan_paths point at them where they moved. A
    DALLE-pytorch train_dalle.py checkpoint records none: bpe_path (+ hug) names its vocabulary, vqgan_paths
    (model .ckpt, config .yaml) or openai_paths (encoder.pkl, decoder.pkl) its VAE unless it is a DiscreteVAE (whose
    weights it holds). note: where the one-line conversion note goes (default: stderr).
    """
    peek = None
    for mmap in (True, False):  # mmap reads only what is touched; files of torch < 1.6 need a plain load
        try:
            peek = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
            break
        except Exception:  # unreadable or pickled objects: each loader gives its own one-line message
            continue
    if not is_dallepytorch_checkpoint(peek):
        return load_native(path, device=device, bpe_path=bpe_path, vqgan_paths=vqgan_paths)
    vqgan_paths, openai_paths = vqgan_paths or (None, None), openai_paths or (None, None)
    sources = Sources(bpe_path=None if bpe_path is None else str(bpe_path), hug=hug,
                      vqgan_model_path=vqgan_paths[0], vqgan_config_path=vqgan_paths[1],
                      openai_encoder_path=openai_paths[0], openai_decoder_path=openai_paths[1])
    converted = load_dallepytorch(path, sources)
    print(f"{path}: a DALLE-pytorch {converted.source['version'] or '(unversioned)'} checkpoint, converted in memory "
          f"(to convert once: python -m dalle_lab.convert dallepytorch {path} OUT.pt)", file=note or sys.stderr)
    for line in converted.notes:
        print(f"note: {line}", file=note or sys.stderr)
    converted.model.to(device).eval()
    converted.vae.to(device).eval()
    return converted.model, converted.tokenizer, converted.vae
