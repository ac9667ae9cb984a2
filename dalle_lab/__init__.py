"""dalle_lab: autoregressive text-to-image transformers (DALL-E / CogView style) with reward fine-tuning.

`import dalle_lab` stays light and offline: the public names below are resolved on first use, so torch, taming,
deepspeed and friends are imported only by the code that needs them.
"""
from dalle_lab.lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "DALLE": "dalle_lab.model",
    "DALLEConfig": "dalle_lab.model",
    "VQGanVAE": "dalle_lab.vae",
    "DiscreteVAE": "dalle_lab.vae",
    "OpenAIDiscreteVAE": "dalle_lab.vae",
    "load_dalle": "dalle_lab.convert",
    "default_vae": "dalle_lab.vae",
    "get_tokenizer": "dalle_lab.tokenizers",
    "ShapesDataset": "dalle_lab.data.shapes",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY, extra=("__version__",))
