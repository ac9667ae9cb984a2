"""Files that ship inside the package (package data, pyproject.toml), so an installed wheel finds them anywhere:

    bpe/<dataset>.model            the default text vocabulary of each built-in dataset (how they were made and the
                                   commands that rebuild them: bpe/README.md at the repository root)
    <dataset>_vqgan.ckpt / .yaml   the default image tokenizer of each built-in dataset (dalle_lab/vae/default.py)
    shapes_clip/                   the project's own small CLIP, for the clip_score reward (dalle_lab/rewards/clip.py)

A leaf: it imports nothing from dalle_lab, so any module may ask it where a shipped file is.
"""
from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent
BPE_DIR = ASSETS_DIR / "bpe"
