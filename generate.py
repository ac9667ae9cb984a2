#!/usr/bin/env python
"""Generate images from captions with a trained DALLE checkpoint.

The console script `dalle-generate`, kept as `python generate.py` for DALLE-pytorch habits; the command line lives in
dalle_lab/cli/generate.py (flags: python generate.py --help).
"""
import sys

from dalle_lab.cli import dalle_generate
from dalle_lab.cli.generate import build_parser, main  # noqa: F401 - generate.main(argv) as before the move

if __name__ == "__main__":
    sys.exit(dalle_generate())
