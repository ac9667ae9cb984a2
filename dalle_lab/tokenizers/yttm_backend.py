"""youtokentome BPE vocabularies (`.model` files), the format DALLE-pytorch users already have.

youtokentome's own id layout is pad 0, unk 1, bos 2, eos 3, which is exactly the layout the model expects, so ids pass
through unchanged.
"""
from __future__ import annotations

import os
from pathlib import Path

import youtokentome as yttm

from dalle_lab.tokenizers.base import BOS_ID, EOS_ID, PAD_ID, TextTokenizer


def read_yttm_alphabet(path: str | os.PathLike) -> set[str]:
    """Check that `path` looks like a youtokentome model and return the characters it knows.

    youtokentome itself happily "loads" any text file as a garbage vocabulary, so the layout is checked here: a
    header line `n_chars n_merges`, n_chars lines `codepoint id`, n_merges lines `left right id`, and a last line
    with the four special ids.
    """
    path = Path(path)
    problem = None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        header = [int(x) for x in lines[0].split()]
        if len(header) != 2:
            problem = "its first line is not `n_chars n_merges`"
        else:
            n_chars, n_merges = header
            if len(lines) != n_chars + n_merges + 2:
                problem = f"it has {len(lines)} lines but its header promises {n_chars + n_merges + 2}"
            else:
                return {chr(int(line.split()[0])) for line in lines[1 : 1 + n_chars]}
    except (UnicodeDecodeError, ValueError, IndexError) as error:
        problem = f"it could not be parsed ({error.__class__.__name__}: {error})"
    raise ValueError(
        f"{path} is not a youtokentome BPE model: {problem}. Pass a `.model` file written by youtokentome or by "
        f"`python -m dalle_lab.tokenizers.train`, or a HuggingFace tokenizers `.json` file"
    )


class YttmTokenizer(TextTokenizer):
    kind = "yttm"

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        self._alphabet = read_yttm_alphabet(self.path)
        self._bpe = yttm.BPE(model=str(self.path))
        self._output_ids = yttm.OutputType.ID

    @property
    def vocab_size(self) -> int:
        return self._bpe.vocab_size()

    def known_characters(self) -> set[str]:
        return self._alphabet

    def _encode_normalized(self, texts: list[str]) -> list[list[int]]:
        return self._bpe.encode(texts, output_type=self._output_ids)

    def _ignored_ids(self) -> set[int]:
        return {PAD_ID, BOS_ID, EOS_ID}

    def _decode_ids(self, ids: list[int]) -> str:
        return self._bpe.decode([ids])[0]
