"""Checkpoints of other packages into this one: DALLE-pytorch 1.x (`python -m dalle_lab.convert dallepytorch IN OUT`,
docs/migrating.md), and `load_dalle`, which takes either format.

Names resolve lazily so `import dalle_lab.convert` stays light.
"""
from importlib import import_module

_LAZY = {
    "ConversionError": "dalle_lab.convert.dallepytorch",
    "is_dallepytorch_checkpoint": "dalle_lab.convert.dallepytorch",
    "Sources": "dalle_lab.convert.convert",
    "load_dallepytorch": "dalle_lab.convert.convert",
    "convert_file": "dalle_lab.convert.convert",
    "load_dalle": "dalle_lab.convert.loading",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dalle_lab.convert' has no attribute {name!r}")


def __dir__():
    return __all__
