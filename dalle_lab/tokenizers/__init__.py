"""BPE text tokenizers: youtokentome `.model` and HuggingFace tokenizers `.json` vocabularies, the shipped default
vocabularies of the built-in datasets (shapes.model, emoji.model: package data in dalle_lab/assets/bpe/), and
training a custom vocabulary.

Backends import their libraries only when a tokenizer is built, so importing this package stays light.
See bpe/README.md for the user-facing guide.
"""
from dalle_lab.tokenizers.base import BOS_ID, EOS_ID, PAD_ID, UNK_ID, TextTokenizer, normalize_caption
from dalle_lab.tokenizers.loading import (
    DEFAULT_BPE_PATH,
    check_vocab_fits,
    default_bpe_path,
    get_tokenizer,
    is_shipped_vocabulary,
    load_tokenizer,
)
from dalle_lab.tokenizers.vocab import train_bpe, train_shapes_vocab

__all__ = [
    "BOS_ID",
    "DEFAULT_BPE_PATH",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "TextTokenizer",
    "check_vocab_fits",
    "default_bpe_path",
    "get_tokenizer",
    "is_shipped_vocabulary",
    "load_tokenizer",
    "normalize_caption",
    "train_bpe",
    "train_shapes_vocab",
]
