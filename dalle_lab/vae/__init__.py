"""Image tokenizers: taming-transformers VQGANs (published checkpoints or trained here), the default Shapes one, and
DALLE-pytorch's DiscreteVAE and OpenAI discrete VAE (for models converted from DALLE-pytorch).

Names resolve lazily so `import dalle_lab.vae` does not import torch or taming.
"""
from dalle_lab.lazy import lazy_exports

_LAZY = {
    "VQGanVAE": "dalle_lab.vae.vqgan",
    "load_vae": "dalle_lab.vae.loading",
    "DiscreteVAE": "dalle_lab.vae.discrete",
    "load_discrete_vae": "dalle_lab.vae.discrete",
    "OpenAIDiscreteVAE": "dalle_lab.vae.openai",
    "default_vae": "dalle_lab.vae.default",
    "make_tiny_vqgan": "dalle_lab.vae.tiny",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
