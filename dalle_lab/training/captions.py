"""Can the model read these captions? Checked before training starts, not on the first batch that holds one.

- Length: a caption with more tokens than text_seq_len is an error naming its file (before step 1), or with
  `--truncate_captions` cut to fit, or with `--skip_long_captions` left out and reported like a corrupt image.
  The built-in Shapes stream is checked against every caption its grammar can produce (nothing can be left out
  of it: a too-long caption there is an error unless cut).
- Unknown words: words the vocabulary does not know (they hold unk pieces - characters it cannot spell - or BPE
  breaks them into single characters, the mark of a word its training captions never used; for the shipped
  vocabularies, exactly the words their captions never used). They are warned about, never fatal: generation
  (generate.py, the align CLI) names them per caption, training counts them per caption file.
"""
from __future__ import annotations

import logging
import math
from functools import lru_cache

from dalle_lab.data.folder import CaptionLines
from dalle_lab.tokenizers.base import shorten

logger = logging.getLogger(__name__)

LONG_CAPTION_MODES = ("error", "truncate", "skip")
_WORDS_SHOWN = 8


def long_caption_mode(truncate: bool, skip: bool) -> str:
    if truncate and skip:
        raise ValueError("--truncate_captions and --skip_long_captions both handle long captions: give one of them")
    return "truncate" if truncate else "skip" if skip else "error"


def too_long_message(where: str, caption: str, tokens: int, text_seq_len: int, tokenizer=None,
                     more: str = "", every: int = 0, measurable: bool = True) -> str:
    """One line for a caption longer than text_seq_len. When the vocabulary does not know some of its words (it
    spells them letter by letter, so the caption is long because the vocabulary is wrong), it says that instead
    of suggesting truncation, which would cut the caption to a few letters. `every`: the number of captions when
    all of them are too long (then the context is too short for this data: cutting or skipping cannot help).
    `measurable`: whether --text_seq_len auto can measure this data (not shards, read as a stream), so it is
    suggested only where it works."""
    auto = " (--text_seq_len auto measures your captions)" if measurable else ""
    words = unknown_words(tokenizer, caption, known_words_of(tokenizer)) if tokenizer is not None else []
    # the pieces the unknown words are spelt in beyond one token each: without them, would the caption fit?
    spelt_out = sum(len(tokenizer.encode(word)) - 1 for word in words)
    if words and tokens - spelt_out <= text_seq_len:
        shown = ", ".join(repr(w) for w in words[:_WORDS_SHOWN]) + (", ..." if len(words) > _WORDS_SHOWN else "")
        return (f"{where}: caption {shorten(caption)} is {tokens} tokens long but text_seq_len is {text_seq_len}{more}, "
                f"because the text vocabulary {tokenizer.path} does not know {len(words)} of its words ({shown}) and "
                f"spells them piece by piece: give a vocabulary trained on your captions (--bpe_path auto, or "
                f"python -m dalle_lab.tokenizers.train --input FOLDER --vocab_size N --output my.model) rather than "
                f"cutting the captions")
    if every:
        return (f"every one of the {every} captions is longer than text_seq_len {text_seq_len}; the longest is "
                f"{where}: {shorten(caption)}, {tokens} tokens: pass --text_seq_len {tokens}{auto}")
    return (f"{where}: caption {shorten(caption)} is {tokens} tokens long but text_seq_len is {text_seq_len}{more}: "
            f"pass --truncate_captions to cut such captions, --skip_long_captions to leave them out, or a larger "
            f"--text_seq_len{auto}")


class LongCaptionCheck:
    """For streamed data (WebDataset shards, checked as they are read): (caption, where) -> keep it? Raises in
    mode "error". Picklable, so DataLoader workers get a copy."""

    def __init__(self, tokenizer, text_seq_len: int, mode: str):
        self.tokenizer, self.text_seq_len, self.mode = tokenizer, text_seq_len, mode

    def __call__(self, caption: str, where: str) -> bool:
        if self.mode == "truncate":
            return True
        tokens = len(self.tokenizer.encode(caption))
        if tokens <= self.text_seq_len:
            return True
        if self.mode == "skip":
            logger.warning("skipping shard sample %s: caption of %d tokens, text_seq_len is %d", where, tokens,
                           self.text_seq_len)
            return False
        raise ValueError(too_long_message(f"shard sample {where}", caption, tokens, self.text_seq_len,
                                          self.tokenizer, measurable=False))


def check_dataset_captions(dataset, tokenizer, text_seq_len: int, mode: str, say=print):
    """Check every caption of a map-style dataset before training; returns the dataset to train on (long
    captions left out in mode "skip"). An image-text folder or token directory (CaptionLines) is checked line by
    line; a dataset with `captions()` (one per item, e.g. the built-in emoji data) item by item. Unknown words
    are counted per caption file and reported through `say`."""
    if isinstance(dataset, CaptionLines):
        _check_caption_lines(dataset, tokenizer, text_seq_len, mode, say)
        report = unknown_words_report(tokenizer, dataset.caption_lines_by_file())
        if report:
            say(report)
        return dataset
    if not hasattr(dataset, "captions"):
        return dataset
    captions = dataset.captions()
    lengths = _token_counter(tokenizer)(captions)
    long = [i for i, n in enumerate(lengths) if n > text_seq_len]
    if long and mode == "error":
        i = long[0]
        more = f" ({len(long)} such captions)" if len(long) > 1 else ""
        raise ValueError(too_long_message(f"{type(dataset).__name__} item {i}", captions[i], lengths[i],
                                          text_seq_len, tokenizer, more))
    if long and mode == "skip":
        import torch

        say(f"skipping {len(long)} items whose caption is longer than text_seq_len {text_seq_len}")
        dataset = torch.utils.data.Subset(dataset, sorted(set(range(len(captions))) - set(long)))
    return dataset


def _check_caption_lines(dataset, tokenizer, text_seq_len: int, mode: str, say) -> None:
    """mode "error": a ValueError naming the first too-long line's file and line number; "truncate": nothing to
    do (the tokenizer cuts); "skip": leave such lines out, and items left without a line, counted."""
    if mode == "truncate":
        return
    lines = dataset.numbered_caption_lines()
    lengths = _token_counter(tokenizer)([line for _, _, line in lines])
    long = [(i, n, line, tokens) for (i, n, line), tokens in zip(lines, lengths) if tokens > text_seq_len]
    if not long:
        return
    i, n, line, tokens = max(long, key=lambda entry: entry[3]) if len(long) == len(lines) else long[0]
    where = f"{dataset.caption_source(i)}, line {n}"
    if len(long) == len(lines) and mode == "skip":  # nothing would be left to train on
        raise ValueError(too_long_message(where, line, tokens, text_seq_len, tokenizer, every=len(lines)))
    if mode == "error":
        more = f" ({len(long) - 1} more such lines)" if len(long) > 1 else ""
        raise ValueError(too_long_message(where, line, tokens, text_seq_len, tokenizer, more,
                                          every=len(lines) if len(long) == len(lines) else 0))
    before = len(dataset.report.long_caption)
    dataset.drop_caption_lines({(i, n) for i, n, _, _ in long})
    say(_skipped_line(dataset.report, len(long), text_seq_len, dataset.report.long_caption[before:]))


def _skipped_line(report, lines: int, text_seq_len: int, emptied: list[str]) -> str:
    """What --skip_long_captions left out, in one line: the folder's report has been said already (open_dataset),
    so it is not repeated here."""
    from dalle_lab.data.folder_report import names

    items = f", and {len(emptied)} image(s) left with no caption ({names(emptied)})" if emptied else ""
    return (f"{report.root}: --skip_long_captions left out {lines} caption line(s) longer than text_seq_len "
            f"{text_seq_len}{items}: {report.images} usable image-caption pairs remain")


def auto_text_seq_len(captions: list[tuple[str, str]], tokenizer, mode: str, say) -> int:
    """--text_seq_len auto: every caption tokenized once, the length distribution printed, and the context chosen:
    the longest caption rounded up to a multiple of 8 (nothing is cut or left out), or with --truncate_captions /
    --skip_long_captions the 99th percentile rounded up (the longer captions are then cut or left out: counted
    here with one example). `captions`: (where, caption) pairs."""
    if not captions:
        raise ValueError("--text_seq_len auto: the data holds no captions to measure")
    lengths = _token_counter(tokenizer)([caption for _, caption in captions])
    ordered = sorted(lengths)
    median, p99, longest = ordered[len(ordered) // 2], ordered[math.ceil(0.99 * len(ordered)) - 1], ordered[-1]
    basis, value = ("p99", p99) if mode in ("truncate", "skip") else ("the longest", longest)
    chosen = max(8, 8 * math.ceil(value / 8))
    say(f"--text_seq_len auto: {len(lengths)} captions of {ordered[0]}-{longest} tokens (median {median}, "
        f"p99 {p99}, max {longest}): text_seq_len {chosen}, {basis} rounded up to a multiple of 8"
        + ("" if basis == "p99" else " (with --truncate_captions or --skip_long_captions: p99 rounded up)"))
    longer = [i for i, n in enumerate(lengths) if n > chosen]
    if longer:
        i = max(longer, key=lambda j: lengths[j])
        where, caption = captions[i]
        say(f"--text_seq_len auto: {len(longer)} of {len(lengths)} captions are longer than {chosen} tokens and will "
            f"be {'cut' if mode == 'truncate' else 'left out'} (e.g. {where}: {shorten(caption)}, {lengths[i]} "
            f"tokens); a number instead of auto keeps them")
    return chosen


def check_caption_set(captions: list[str], tokenizer, text_seq_len: int, mode: str, what: str) -> None:
    """For an endless stream drawn from a finite set of captions (the built-in Shapes grammar): every caption it
    can ever produce is checked before step 1. Leaving some out would change the stream itself, so only
    --truncate_captions or a longer text context fixes a caption that is too long."""
    if mode == "truncate":
        return
    lengths = _token_counter(tokenizer)(captions)
    long = [i for i, n in enumerate(lengths) if n > text_seq_len]
    if long:
        i = max(long, key=lambda j: lengths[j])
        raise ValueError(f"{what}: caption {shorten(captions[i])} is {lengths[i]} tokens long but text_seq_len is "
                         f"{text_seq_len} ({len(long)} of its {len(captions)} captions are longer): pass "
                         f"--truncate_captions to cut them, or --text_seq_len {lengths[i]}"
                         + (" (--skip_long_captions cannot leave captions out of this stream)" if mode == "skip"
                            else ""))


def _token_counter(tokenizer):
    def count(captions: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer.encode_batch(captions)]

    return count


# ------------------------------------------------------------------------------------------------ unknown words

def known_words_of(tokenizer) -> frozenset[str] | None:
    """The words a shipped vocabulary's training captions used (None for a user's vocabulary: not known)."""
    from dalle_lab.data.builtin import BUILTIN_DATASETS

    for name in BUILTIN_DATASETS:
        try:
            from dalle_lab.tokenizers.loading import shipped_bpe_path

            if str(shipped_bpe_path(name).resolve()) == str(tokenizer.path):
                return _builtin_words(name)
        except (ImportError, OSError, ValueError):  # the emoji captions need optional packages
            return None
    return None


@lru_cache(maxsize=None)
def _builtin_words(name: str) -> frozenset[str]:
    from dalle_lab.data.builtin import builtin_vocabulary_captions
    from dalle_lab.tokenizers.base import normalize_caption

    return frozenset(word for caption in builtin_vocabulary_captions(name)
                     for word in normalize_caption(caption).split())


def unknown_words(tokenizer, caption: str, known_words=None, _cache=None) -> list[str]:
    """The words of `caption` the vocabulary does not know, in order, each once."""
    from dalle_lab.tokenizers.base import UNK_ID, normalize_caption

    cache = {} if _cache is None else _cache
    found = []
    for word in dict.fromkeys(normalize_caption(caption).split()):
        if word not in cache:
            cache[word] = _is_unknown(tokenizer, word, known_words, UNK_ID)
        if cache[word]:
            found.append(word)
    return found


def _is_unknown(tokenizer, word: str, known_words, unk_id: int) -> bool:
    ids = tokenizer.encode(word)
    if unk_id in ids or tokenizer.unknown_characters(word):
        return True
    if known_words is not None:
        return word not in known_words
    # a word the training captions used often enough is one or a few merged pieces; one BPE could only spell
    # out letter by letter (most pieces a single character) it has in all likelihood never seen
    letters = [p for p in (tokenizer.decode([i]).strip() for i in ids) if p]
    return len(word) >= 3 and len(letters) > 1 and 2 * sum(len(p) == 1 for p in letters) > len(letters)


def unknown_words_warning(tokenizer, captions: list[str]) -> str | None:
    """One line naming each caption's unknown words (None when there are none): for generation."""
    known, cache = known_words_of(tokenizer), {}
    parts = []
    for caption in captions:
        words = unknown_words(tokenizer, caption, known, cache)
        if words:
            parts.append(f"{caption!r}: {', '.join(words)}")
    if not parts:
        return None
    return ("warning: the text vocabulary does not know these words (the model never learnt them, so they "
            f"condition the image little or not at all): {'; '.join(parts)}")


def unknown_words_report(tokenizer, lines_by_file: dict[str, list[str]]) -> str | None:
    """For training data: how many caption files hold each unknown word (None when there are none)."""
    known, cache = known_words_of(tokenizer), {}
    files_per_word: dict[str, int] = {}
    files_with_any = 0
    for lines in lines_by_file.values():
        words = set()
        for line in lines:
            words.update(unknown_words(tokenizer, line, known, cache))
        files_with_any += bool(words)
        for word in words:
            files_per_word[word] = files_per_word.get(word, 0) + 1
    if not files_per_word:
        return None
    ranked = sorted(files_per_word.items(), key=lambda item: (-item[1], item[0]))
    shown = ", ".join(f"{word!r} ({n} file{'s' if n > 1 else ''})" for word, n in ranked[:_WORDS_SHOWN])
    more = f", ... ({len(ranked) - _WORDS_SHOWN} more words)" if len(ranked) > _WORDS_SHOWN else ""
    return (f"warning: {files_with_any} of {len(lines_by_file)} caption files use words the text vocabulary does "
            f"not know: {shown}{more}. Training continues; a vocabulary trained on these captions "
            f"(python -m dalle_lab.tokenizers.train) would read them")


def warn_unknown_words(tokenizer, captions: list[str], program: str) -> None:
    """Print unknown_words_warning to stderr, prefixed by the program's name (nothing when all words are known)."""
    import sys

    warning = unknown_words_warning(tokenizer, captions)
    if warning:
        print(f"{program}: {warning}", file=sys.stderr)
