#!/usr/bin/env python
"""Train an image tokenizer (a taming-transformers VQGAN).

The console script `dalle-train-vae`, kept as `python train_vae.py` for DALLE-pytorch habits; the command line lives in
dalle_lab/cli/train_vae.py (flags: python train_vae.py --help).
"""
import sys

from dalle_lab.cli import dalle_train_vae
from dalle_lab.cli.train_vae import build_parser, main  # noqa: F401 - train_vae.main(argv) as before the move

if __name__ == "__main__":
    sys.exit(dalle_train_vae())
