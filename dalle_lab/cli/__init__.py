"""The command lines: each main(argv) parses flags, builds a config, calls the library and returns an exit status.

The console scripts (pyproject.toml) are the dalle_* functions below (dalle-train is dalle_train); the root scripts
train_dalle.py, generate.py and train_vae.py, kept for DALLE-pytorch habits, call the same ones, and so does
`python -m <module>`:

    dalle-train       dalle_lab/cli/train_dalle.py        python train_dalle.py
    dalle-generate    dalle_lab/cli/generate.py           python generate.py
    dalle-train-vae   dalle_lab/cli/train_vae.py          python train_vae.py
    dalle-align       dalle_lab/align/__main__.py         python -m dalle_lab.align               (needs [align])
    dalle-parity      dalle_lab/precision/parity.py       python -m dalle_lab.precision.parity    (needs [align])
    dalle-bpe         dalle_lab/tokenizers/train.py       python -m dalle_lab.tokenizers.train
    dalle-quality     dalle_lab/quality.py                python -m dalle_lab.quality

Each module is imported only when its command runs, so one command never pays for another's imports.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from dalle_lab.extras import MissingExtra, require_extra


def run(main: Callable, needs: str | None = None, argv=None) -> int:
    """Run a command's main(argv): with `needs`, that extra is checked before any work; a missing optional package
    is one line on stderr and exit status 1, not a traceback. A main that returns no status (train_vae prints its
    metrics, parity returns its report) ran to the end: 0."""
    prog = Path(sys.argv[0]).name
    try:
        if needs:
            require_extra(needs, prog)
        status = main(argv)
    except MissingExtra as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    return status if isinstance(status, int) else 0


def dalle_train() -> int:
    from dalle_lab.cli.train_dalle import main

    return run(main)


def dalle_generate() -> int:
    from dalle_lab.cli.generate import main

    return run(main)


def dalle_train_vae() -> int:
    from dalle_lab.cli.train_vae import main

    return run(main)


def dalle_align() -> int:
    from dalle_lab.align.__main__ import main

    return run(main, needs="align")


def dalle_parity() -> int:
    from dalle_lab.precision.parity import main

    return run(main, needs="align")


def dalle_bpe() -> int:
    from dalle_lab.tokenizers.train import main

    return run(main)


def dalle_quality() -> int:
    from dalle_lab.quality import main

    return run(main)
