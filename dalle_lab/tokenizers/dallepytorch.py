"""DALLE-pytorch's three text tokenizers, reproduced id for id so a model converted from it reads captions as it did.

- SimpleTokenizer: its default, CLIP's byte-level BPE (49408 ids: 256 bytes, 256 bytes ending a word, 48894 merges,
  start / end of text). The merges file (`bpe_simple_vocab_16e6.txt`, in dalle-pytorch's wheel under
  dalle_pytorch/data/, or CLIP's `.txt.gz`) is read from the path the user gives; nothing ships or downloads here.
  Captions are cleaned as there: ftfy's fix_text, HTML entities unescaped twice, whitespace collapsed, lower case.
- DallePytorchYttm: its `--bpe_path X.model` (youtokentome) reading: the caption exactly as given (no lower-casing,
  unlike dalle_lab's own YttmTokenizer).
- DallePytorchHug: its `--hug --bpe_path X.json`: the file's own pipeline with a ByteLevel post-processor, ids as
  the file numbers them (no pad shift, unlike dalle_lab's HFTokenizer).

All pad with id 0, as DALLE-pytorch's `tokenize` did. A checkpoint records the file's path and sha256 (`identity`).
"""
from __future__ import annotations

import gzip
import html
import os
from functools import lru_cache
from pathlib import Path

import ftfy
import regex
import youtokentome as yttm
from tokenizers import Tokenizer
from tokenizers.processors import ByteLevel

from dalle_lab.tokenizers.base import TextTokenizer
from dalle_lab.tokenizers.yttm_backend import read_yttm_alphabet

SIMPLE_VOCAB_SIZE = 49408
_MERGES = SIMPLE_VOCAB_SIZE - 2 * 256 - 2  # the merges CLIP's vocabulary keeps (the file holds more)
_SPECIALS = ("<|startoftext|>", "<|endoftext|>")
# CLIP's pre-tokenizer: the two specials, English contractions, letter runs, single digits, other non-space runs
_WORDS = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


@lru_cache()
def byte_symbols() -> dict[int, str]:
    """Each byte -> a printable character standing for it (bytes that print as themselves keep their character,
    the others are given characters from 256 up), in CLIP's order: printable bytes first."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def is_clip_merges_file(path: str | os.PathLike) -> bool:
    """Whether a --bpe_path is CLIP's merges file (its first line `#version: ...`), i.e. SimpleTokenizer's."""
    try:
        return "#version" in _read_lines(Path(path), limit=1)[0]
    except (OSError, UnicodeDecodeError, IndexError, EOFError):
        return False


def _read_lines(path: Path, limit: int | None = None) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        if limit is None:
            return handle.read().split("\n")
        return [handle.readline().rstrip("\n") for _ in range(limit)]


class SimpleTokenizer(TextTokenizer):
    kind = "dallepytorch_simple"

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        lines = _read_lines(self.path)
        merges = [tuple(line.split()) for line in lines[1:1 + _MERGES]]
        if "#version" not in lines[0] or len(merges) != _MERGES or any(len(m) != 2 for m in merges):
            raise ValueError(f"{self.path} is not CLIP's BPE merges file (bpe_simple_vocab_16e6.txt: a '#version' "
                             f"line, then at least {_MERGES} merges 'a b'): pass that file, found in dalle-pytorch's "
                             "wheel under dalle_pytorch/data/")
        symbols = list(byte_symbols().values())
        vocab = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges] + list(_SPECIALS)
        self.ids = {token: i for i, token in enumerate(vocab)}
        self.tokens = vocab
        self.ranks = {merge: rank for rank, merge in enumerate(merges)}
        self._words = regex.compile(_WORDS, regex.IGNORECASE)
        self._space = regex.compile(r"\s+")
        self._cache = {special: [self.ids[special]] for special in _SPECIALS}

    @property
    def vocab_size(self) -> int:
        return SIMPLE_VOCAB_SIZE

    def known_characters(self):
        return None  # byte-level: every character can be spelled

    def clean(self, text: str) -> str:
        text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
        return self._space.sub(" ", text).strip().lower()

    def encode_batch(self, texts) -> list[list[int]]:
        return [self._encode(text) for text in texts]  # its own cleaning, not dalle_lab's normalize_caption

    def _encode(self, text: str) -> list[int]:
        symbols = byte_symbols()
        ids = []
        for word in self._words.findall(self.clean(text)):
            if word not in self._cache:
                spelled = "".join(symbols[b] for b in word.encode("utf-8"))
                self._cache[word] = [self.ids[piece] for piece in self._merge(spelled)]
            ids.extend(self._cache[word])
        return ids

    def _merge(self, word: str) -> list[str]:
        """Byte-pair merges of one word, its last symbol marked as ending it: repeatedly join every occurrence
        (left to right) of the adjacent pair that was learned earliest, until no learned pair is left."""
        parts = list(word[:-1]) + [word[-1] + "</w>"]
        while len(parts) > 1:
            pairs = set(zip(parts, parts[1:]))
            best = min(pairs, key=lambda pair: self.ranks.get(pair, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return parts

    def _ignored_ids(self) -> set[int]:
        return {0, self.ids[_SPECIALS[0]], self.ids[_SPECIALS[1]]}

    def _decode_ids(self, ids: list[int]) -> str:
        to_byte = {symbol: b for b, symbol in byte_symbols().items()}
        out = bytearray()
        for i in ids:
            token = self.tokens[i]
            ends_word = token.endswith("</w>")
            out.extend(to_byte[c] for c in (token[:-4] if ends_word else token))
            if ends_word:
                out.extend(b" ")
        return out.decode("utf-8", errors="replace").strip()


class DallePytorchYttm(TextTokenizer):
    kind = "dallepytorch_yttm"

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        self._alphabet = read_yttm_alphabet(self.path)  # refuses files that are not youtokentome models
        self._bpe = yttm.BPE(model=str(self.path))
        self._ids = yttm.OutputType.ID

    @property
    def vocab_size(self) -> int:
        return self._bpe.vocab_size()

    def known_characters(self):
        return self._alphabet

    def encode_batch(self, texts) -> list[list[int]]:
        return self._bpe.encode(list(texts), output_type=self._ids)

    def _decode_ids(self, ids: list[int]) -> str:
        return self._bpe.decode([ids])[0]


class DallePytorchHug(TextTokenizer):
    kind = "dallepytorch_hug"

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        try:
            self._tok = Tokenizer.from_file(str(self.path))
        except Exception as error:  # the Rust loader raises its own exception type
            raise ValueError(f"{self.path} is not a HuggingFace tokenizers JSON file ({error}): --hug needs one") from error
        self._tok.post_processor = ByteLevel(trim_offsets=True)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def known_characters(self):
        return None

    def encode_batch(self, texts) -> list[list[int]]:
        return [self._tok.encode(text).ids for text in texts]

    def _decode_ids(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


KINDS = {cls.kind: cls for cls in (SimpleTokenizer, DallePytorchYttm, DallePytorchHug)}


def dallepytorch_tokenizer(bpe_path: str | os.PathLike, hug: bool = False) -> TextTokenizer:
    """The tokenizer DALLE-pytorch built from `--bpe_path` (and `--hug`); CLIP's merges file gives its default."""
    path = Path(bpe_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"text vocabulary {path} does not exist: pass the --bpe_path the model was trained "
                                "with (or CLIP's bpe_simple_vocab_16e6.txt for DALLE-pytorch's default tokenizer)")
    if is_clip_merges_file(path):
        return SimpleTokenizer(path)
    return DallePytorchHug(path) if hug else DallePytorchYttm(path)
