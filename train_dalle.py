#!/usr/bin/env python
"""Train a DALLE (the built-in Shapes data with no flags).

The console script `dalle-train`, kept as `python train_dalle.py` for DALLE-pytorch habits; the command line lives in
dalle_lab/cli/train_dalle.py (flags: python train_dalle.py --help).
"""
import sys

from dalle_lab.cli import dalle_train
from dalle_lab.cli.train_dalle import main  # noqa: F401 - train_dalle.main(argv) as before the move

if __name__ == "__main__":
    sys.exit(dalle_train())
