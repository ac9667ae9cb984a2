"""Checkpoints of other packages into this one: DALLE-pytorch 1.x (`python -m dalle_lab.convert dallepytorch IN OUT`,
docs/migrating.md), and `load_dalle`, which takes either format.

Names resolve lazily so `import dalle_lab.convert` stays light.
"""
from dalle_lab.lazy import lazy_exports

_LAZY = {
    "ConversionError": "dalle_lab.convert.dallepytorch",
    "is_dallepytorch_checkpoint": "dalle_lab.convert.dallepytorch",
    "Sources": "dalle_lab.convert.convert",
    "load_dallepytorch": "dalle_lab.convert.convert",
    "convert_file": "dalle_lab.convert.convert",
    "load_dalle": "dalle_lab.convert.loading",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
