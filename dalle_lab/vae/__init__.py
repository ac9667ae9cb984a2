"""Image tokenizers: taming-transformers VQGANs (published checkpoints or trained here), the default Shapes one, and
DALLE-pytorch's DiscreteVAE and OpenAI discrete VAE (for models converted from DALLE-pytorch).

Names resolve lazily so `import dalle_lab.vae` does not import torch or taming.
"""
from importlib import import_module

_LAZY = {
    "VQGanVAE": "dalle_lab.vae.vqgan",
    "load_vae": "dalle_lab.vae.loading",
    "DiscreteVAE": "dalle_lab.vae.discrete",
    "load_discrete_vae": "dalle_lab.vae.discrete",
    "OpenAIDiscreteVAE": "dalle_lab.vae.openai",
    "default_vae": "dalle_lab.vae.default",
    "make_tiny_vqgan": "dalle_lab.vae.tiny",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dalle_lab.vae' has no attribute {name!r}")


def __dir__():
    return __all__
