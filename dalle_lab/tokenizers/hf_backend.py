"""HuggingFace `tokenizers` vocabularies (`tokenizer.json` files).

Id 0 must be pad for the model (it pads the text context and is never a real token). Files written by
`train_bpe(..., backend="hf")` put `<pad>` at id 0, so their ids pass through unchanged. Any other file (GPT-2,
BERT, ... whose id 0 is a real token) is shifted up by one: id 0 becomes pad and file id i becomes i + 1, so such a
vocabulary needs num_text_tokens = file size + 1.
"""
from __future__ import annotations

import json
import os

from tokenizers import Tokenizer

from dalle_lab.tokenizers.base import PAD_ID, TextTokenizer, shorten


def _spelled_characters(model: dict) -> set[str] | None:
    """Single characters a BPE vocabulary holds (its alphabet), or None when that does not bound what it can
    encode: byte fallback, or other model types (WordLevel/WordPiece/Unigram handle unknowns themselves)."""
    if model.get("type") != "BPE" or model.get("byte_fallback") or not isinstance(model.get("vocab"), dict):
        return None
    prefixes = [p for p in (model.get("continuing_subword_prefix"), "▁") if p]
    alphabet = set()
    for token in model["vocab"]:
        for prefix in prefixes:
            if token.startswith(prefix) and len(token) > len(prefix):
                token = token[len(prefix) :]
        suffix = model.get("end_of_word_suffix")
        if suffix and token.endswith(suffix) and len(token) > len(suffix):
            token = token[: -len(suffix)]
        if len(token) == 1:
            alphabet.add(token)
    return alphabet


class HFTokenizer(TextTokenizer):
    kind = "hf"

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        try:
            spec = json.loads(self.path.read_text(encoding="utf-8"))
            self._tok = Tokenizer.from_str(json.dumps(spec))
        except Exception as error:  # the Rust loader raises its own exception type
            raise ValueError(
                f"{self.path} is not a HuggingFace tokenizers file ({error.__class__.__name__}: {error}). Pass a "
                f"`tokenizer.json` saved by `tokenizers` (Tokenizer.save), or a youtokentome `.model` file"
            ) from error
        # The model controls length itself; a file's own truncation/padding settings would fight `tokenize`.
        self._tok.no_truncation()
        self._tok.no_padding()

        added = self._tok.get_added_tokens_decoder()  # {id: AddedToken}
        first = added.get(0)
        self.id_offset = 0 if first is not None and first.special and "pad" in first.content.lower() else 1

        model = spec.get("model", {})
        self._unk_token = model.get("unk_token")
        byte_level = "ByteLevel" in json.dumps(spec.get("pre_tokenizer"))
        self._alphabet = None if byte_level else _spelled_characters(model)
        # Decoding drops pad and the file's other special tokens (bos, eos, cls, ...) but keeps unk visible.
        self._ignored = {PAD_ID} | {
            i + self.id_offset for i, tok in added.items() if tok.special and tok.content != self._unk_token
        }

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True) + self.id_offset

    def known_characters(self) -> set[str] | None:
        return self._alphabet

    def _encode_normalized(self, texts: list[str]) -> list[list[int]]:
        if self._unk_token is None and self._alphabet is not None:
            # Without an unk token a HF BPE drops unseen characters without a trace: refuse instead.
            for text in texts:
                unknown = {ch for ch in text if ch != " " and ch not in self._alphabet}
                if unknown:
                    raise ValueError(
                        f"caption {shorten(text)} has characters {''.join(sorted(unknown))!r} that {self.path} "
                        f"cannot encode, and that vocabulary has no unk token, so they would be dropped silently; "
                        f"retrain the vocabulary on captions that include them, or remove them from the caption"
                    )
        encodings = self._tok.encode_batch(texts, add_special_tokens=False)
        rows = [[i + self.id_offset for i in enc.ids] for enc in encodings]
        for text, ids in zip(texts, rows):
            if PAD_ID in ids:  # the file matches its pad token's text inside captions, e.g. a literal "<pad>"
                raise ValueError(f"caption {shorten(text)} contains the text of {self.path}'s pad token; id 0 "
                                 f"must only pad, so remove that text from the caption")
        return rows

    def _ignored_ids(self) -> set[int]:
        return self._ignored

    def _decode_ids(self, ids: list[int]) -> str:
        return self._tok.decode([i - self.id_offset for i in ids], skip_special_tokens=False)
