"""Training a BPE text vocabulary from captions: a caption file, an image-text folder, or a list of strings.

Captions are normalised exactly as the tokenizers normalise them at encoding time (`normalize_caption`), and every
character present is kept in the vocabulary (so no caption seen in training encodes to unk).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import string
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Sequence, Union

import youtokentome as yttm
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from dalle_lab.tokenizers.base import PAD_ID, SPECIAL_TOKENS, TextTokenizer, normalize_caption
from dalle_lab.tokenizers.loading import get_tokenizer
from dalle_lab.utils import atomic_write

Source = Union[str, os.PathLike]
BACKENDS = ("yttm", "hf")
# A BPE vocabulary needs one token per character, the word-start marker "▁" and pad/unk/bos/eos.
_FIXED_TOKENS = 1 + 4
# Always spelled by the shipped vocabularies, so prompts outside the grammar encode letter by letter
# instead of turning into unk.
SPELLING_CHARACTERS = string.ascii_lowercase + string.digits + ".,;:!?'\"-()&/+%#"
SHAPES_VOCAB_SIZE = 256


def read_captions(source: Source) -> Iterator[str]:
    """Caption lines from a text file (one caption a line), an image-text folder (every line of every image's .txt,
    via dalle_lab.data.iter_folder_captions) or a WebDataset shard (.tar: the txt of every sample with an image)."""
    path = Path(source).expanduser()
    if path.is_dir():
        try:
            from dalle_lab.data import iter_folder_captions
        except ImportError as error:
            raise RuntimeError(
                f"reading captions from the folder {path} needs dalle_lab.data.iter_folder_captions, which this "
                f"installation lacks ({error}); export the captions to a text file (one a line) and pass that"
            ) from error
        yield from iter_folder_captions(path)
    elif path.is_file() and path.suffix.lower() == ".tar":  # a WebDataset shard: its samples' captions
        from dalle_lab.data.wds import shard_captions

        yield from shard_captions(path)
    elif path.is_file():
        with open(path, encoding="utf-8") as handle:
            try:
                yield from handle
            except UnicodeDecodeError as error:
                raise ValueError(f"caption file {path} is not UTF-8 text ({error}); convert it, e.g. "
                                 f"`iconv -f latin1 -t utf-8 {path.name} > captions.utf8.txt`") from error
    else:
        raise FileNotFoundError(
            f"caption source {path} does not exist: pass a text file with one caption a line, or an image-text "
            f"folder (images with same-name .txt caption files)"
        )


def collect_captions(texts_or_paths: Source | Iterable[Source]) -> list[str]:
    """Normalised, non-empty captions from a path (str or PathLike: a caption file or an image-text folder) or an
    iterable whose items are captions (str) or paths (PathLike objects only, so a caption is never mistaken for a
    file name)."""
    if isinstance(texts_or_paths, (str, os.PathLike)):
        raw: Iterable[str] = read_captions(texts_or_paths)
    else:
        raw = _expand(texts_or_paths)
    captions = [caption for caption in map(normalize_caption, raw) if caption]
    if not captions:
        where = texts_or_paths if isinstance(texts_or_paths, (str, os.PathLike)) else "the given captions"
        raise ValueError(f"no non-empty captions found in {where}: nothing to train a vocabulary on")
    return captions


def _expand(items: Iterable[Source]) -> Iterator[str]:
    for item in items:
        if isinstance(item, os.PathLike):
            yield from read_captions(item)
        else:
            yield item


def minimum_vocab_size(captions: Iterable[str], extra_characters: str = "") -> int:
    """The smallest vocab_size that can spell every character of the (normalised) captions."""
    return len(_alphabet(captions, extra_characters)) + _FIXED_TOKENS


def _alphabet(captions: Iterable[str], extra_characters: str = "") -> list[str]:
    """Every character a vocabulary must spell (spaces are word boundaries, not tokens), sorted."""
    characters = {ch for caption in captions for ch in caption} | set(extra_characters)
    characters.discard(" ")
    return sorted(characters)


def backend_from_suffix(output_path: Source, backend: str | None) -> str:
    """`get_tokenizer` picks the backend by suffix (.json: hf, .model: yttm), so the output name must agree."""
    suffix = Path(output_path).suffix
    implied = {".json": "hf", ".model": "yttm"}.get(suffix)
    if backend is None:
        if implied is None:
            raise ValueError(f"cannot tell the backend from {output_path}: name it *.model (youtokentome) or *.json "
                             f"(HuggingFace tokenizers), or pass backend")
        return implied
    if backend not in BACKENDS:
        raise ValueError(f"unknown tokenizer backend {backend!r}; expected one of {BACKENDS}")
    if implied is not None and implied != backend:
        raise ValueError(f"output {output_path} has the suffix of a {implied} vocabulary but backend={backend!r}; "
                         f"use {'.model' if backend == 'yttm' else '.json'} for {backend}")
    return backend


def train_bpe(
    texts_or_paths: Source | Iterable[Source],
    vocab_size: int,
    output_path: Source,
    backend: str | None = None,
    extra_characters: str = "",
    verbose: bool = False,
) -> TextTokenizer:
    """Train a BPE vocabulary of at most `vocab_size` tokens (pad, unk, bos, eos included) and write it to
    `output_path` (atomically); return the loaded tokenizer.

    texts_or_paths: a caption file or image-text folder (str or PathLike), or an iterable of captions / PathLikes.
    backend: "yttm" (youtokentome, `.model`) or "hf" (HuggingFace tokenizers, `.json`); None: from the suffix.
    extra_characters: characters to keep in the vocabulary even if no caption uses them.
    The vocabulary can come out smaller than vocab_size when the captions allow no more merges.
    """
    backend = backend_from_suffix(output_path, backend)
    captions = collect_captions(texts_or_paths)
    needed = minimum_vocab_size(captions, extra_characters)
    if vocab_size < needed:
        raise ValueError(
            f"vocab_size {vocab_size} is too small: the captions use {needed - _FIXED_TOKENS} distinct characters, "
            f"and a BPE vocabulary needs a token for each plus the word-start marker and pad/unk/bos/eos. Use "
            f"--vocab_size {needed} or more"
        )
    with tempfile.TemporaryDirectory(prefix="dalle_lab_bpe_") as tmp:
        trained = Path(tmp) / ("vocab.json" if backend == "hf" else "vocab.model")
        if backend == "hf":
            _train_hf(captions, vocab_size, trained, extra_characters)
        else:
            _train_yttm(captions, vocab_size, trained, extra_characters, verbose)
        atomic_write(output_path, lambda tmp_path: shutil.copyfile(trained, tmp_path))
    return get_tokenizer(output_path)


def _train_yttm(captions: list[str], vocab_size: int, output: Path, extra_characters: str, verbose: bool) -> None:
    corpus = output.with_suffix(".txt")
    lines = list(captions)
    if extra_characters:
        lines.append(" ".join(_alphabet([], extra_characters)))
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with contextlib.nullcontext() if verbose else _silenced_stderr():
        # coverage=1.0 keeps every character; pad/unk/bos/eos keep youtokentome's defaults 0/1/2/3.
        yttm.BPE.train(data=str(corpus), model=str(output), vocab_size=vocab_size, coverage=1.0)


def _train_hf(captions: list[str], vocab_size: int, output: Path, extra_characters: str) -> None:
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[1]))
    tokenizer.normalizer = normalizers.Lowercase()  # so the file also lower-cases when used outside dalle_lab
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()  # "▁" marks word starts, as in youtokentome
    tokenizer.decoder = decoders.Metaspace()
    alphabet = _alphabet(captions, extra_characters)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        # youtokentome's names and order: id 0 is <PAD>, so HFTokenizer needs no id shift for files trained here.
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tokenizer.train_from_iterator(captions, trainer)
    assert tokenizer.token_to_id(SPECIAL_TOKENS[PAD_ID]) == PAD_ID
    tokenizer.save(str(output))


@contextlib.contextmanager
def _silenced_stderr():
    """youtokentome's trainer logs from C++ straight to file descriptor 2 (std::cerr); send that to /dev/null."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def caption_lengths(tokenizer: TextTokenizer, captions: Sequence[str]) -> list[int]:
    """Tokens per caption: what --text_seq_len must hold (or truncation will cut)."""
    return [len(ids) for ids in tokenizer.encode_batch(list(captions))]


def train_shapes_vocab(output_path: Source, vocab_size: int = SHAPES_VOCAB_SIZE, backend: str | None = None,
                       verbose: bool = False) -> TextTokenizer:
    """The recipe of the shipped shapes.model: every caption of the Shapes grammar, plus lower-case ASCII
    letters, digits and common punctuation so other prompts still encode (letter by letter) rather than as unk.

    youtokentome breaks ties between equally frequent pairs in no fixed order, so a rerun gives an equivalent
    vocabulary (the same tokens, one per word of the grammar) whose ids may be permuted, and thus a new hash.
    """
    from dalle_lab.data.shapes import all_captions

    return train_bpe(all_captions(), vocab_size, output_path, backend=backend,
                     extra_characters=SPELLING_CHARACTERS, verbose=verbose)
