"""What every text tokenizer shares: caption normalisation, padding/truncation into a fixed context, identity.

The backends (youtokentome, HuggingFace tokenizers) only supply `encode_batch`, `_decode_ids`, `vocab_size` and the
set of characters they know; everything a model or a data loader relies on lives here, once.

Id layout seen by the model (both backends):
    0  pad    fills the context after the caption; never produced by `encode`
    1  unk    stands for each character the vocabulary has never seen (decoded as "<UNK>")
    2  bos, 3  eos    reserved; `tokenize` does not add them (the model adds its own start-of-text handling)
A HuggingFace file whose id 0 is not a pad token is shifted up by one so that this layout still holds for pad.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

import torch

from dalle_lab.utils import file_sha256

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
SPECIAL_TOKENS = ("<PAD>", "<UNK>", "<BOS>", "<EOS>")

_MAX_SHOWN_CAPTION = 120


def normalize_caption(text: str) -> str:
    """The one text normalisation used for training vocabularies and for encoding: lower-case, and every run of
    whitespace (spaces, tabs, newlines) collapsed to one space with none at the ends.

    Lower-casing keeps "A Red Circle" and "a red circle" the same prompt and keeps small vocabularies small.
    """
    return " ".join(text.lower().split())


def shorten(text: str, limit: int = _MAX_SHOWN_CAPTION) -> str:
    """repr() of a caption, clipped so error messages stay readable for very long captions."""
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


class TextTokenizer:
    """Base class: a BPE vocabulary loaded from `path`. Subclasses set `kind` and implement the backend hooks."""

    kind: str = "base"

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).resolve()
        # Hashed when loaded, so a checkpoint records the vocabulary actually in use even if the file changes later.
        self.sha256 = file_sha256(self.path)

    # ---- backend hooks -------------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids the model's text embedding must hold (all ids are < vocab_size, pad included)."""
        raise NotImplementedError

    def _encode_normalized(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def _decode_ids(self, ids: list[int]) -> str:
        """Decode ids with pad (and other non-text specials) already removed."""
        raise NotImplementedError

    def _ignored_ids(self) -> set[int]:
        return {PAD_ID}

    def known_characters(self) -> set[str] | None:
        """Characters the vocabulary can spell, or None when it can spell anything (byte-level vocabularies)."""
        raise NotImplementedError

    # ---- shared behaviour ----------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Normalised caption -> token ids (no padding, no bos/eos). An empty caption gives []."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._encode_normalized([normalize_caption(text) for text in texts])

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids (a list, or a 1-D tensor such as a row of `tokenize`) -> text; pad ids are skipped."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        ignored = self._ignored_ids()
        return self._decode_ids([int(i) for i in ids if int(i) not in ignored])

    def unknown_characters(self, text: str) -> set[str]:
        """Characters of the (normalised) caption that the vocabulary cannot spell; they encode as unk."""
        known = self.known_characters()
        if known is None:
            return set()
        return {ch for ch in normalize_caption(text) if ch != " " and ch not in known}

    def tokenize(self, texts: str | Sequence[str], context_length: int, truncate_text: bool = False):
        """Captions -> LongTensor (B, context_length): each caption's ids, then pad (0) up to context_length.

        A caption with more than context_length tokens raises ValueError naming it, unless truncate_text is True,
        in which case its first context_length tokens are kept. An empty caption gives a row of pad only (the same
        row classifier-free guidance uses as the "no prompt" condition).
        """
        if isinstance(texts, str):
            texts = [texts]
        if context_length < 1:
            raise ValueError(f"context_length must be at least 1, got {context_length}")
        rows = torch.full((len(texts), context_length), PAD_ID, dtype=torch.long)
        for row, (text, ids) in enumerate(zip(texts, self.encode_batch(texts))):
            if len(ids) > context_length:
                if not truncate_text:
                    raise ValueError(
                        f"caption {shorten(text)} is {len(ids)} tokens long but the text context holds "
                        f"{context_length}: pass --truncate_captions (truncate_text=True) to keep its first "
                        f"{context_length} tokens, or shorten it (a trained model's text context is fixed; for a new "
                        "model, train_dalle.py --text_seq_len sets it)"
                    )
                ids = ids[:context_length]
            if ids:
                rows[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return rows

    @property
    def identity(self) -> dict:
        """What a checkpoint records to find this exact vocabulary again: backend kind, file path, file hash."""
        return {"kind": self.kind, "path": str(self.path), "sha256": self.sha256}

    # youtokentome's BPE object cannot be pickled, yet DataLoader workers started with "spawn" pickle the dataset
    # and the tokenizer it holds: pickle the file's identity and reload the file on the other side instead.
    def __getstate__(self) -> dict:
        return {"path": str(self.path), "sha256": self.sha256}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, state["path"])
        if self.sha256 != state["sha256"]:
            raise ValueError(f"text vocabulary {self.path} changed while it was being sent to another process")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path={str(self.path)!r}, vocab_size={self.vocab_size})"
