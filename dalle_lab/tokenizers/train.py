"""Command line: train a BPE text vocabulary that --bpe_path then loads.

    python -m dalle_lab.tokenizers.train --input captions.txt --vocab_size 2000 --output my.model
    python -m dalle_lab.tokenizers.train --input path/to/image_text_folder --vocab_size 2000 --output my.json
    python -m dalle_lab.tokenizers.train --input shards/000.tar shards/001.tar --vocab_size 2000 --output my.model

The shipped vocabularies, rebuilt from the repository root (they write the files the package ships):

    python -m dalle_lab.tokenizers.train --dataset shapes --vocab_size 256 --output dalle_lab/assets/bpe/shapes.model
    python -m dalle_lab.tokenizers.train --dataset emoji --vocab_size 1024 --output dalle_lab/assets/bpe/emoji.model
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dalle_lab.data.builtin import BUILTIN_DATASETS, builtin_vocabulary_captions
from dalle_lab.flags import HelpFormatter
from dalle_lab.tokenizers.vocab import (
    BACKENDS,
    SPELLING_CHARACTERS,
    caption_lengths,
    collect_captions,
    train_bpe,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dalle_lab.tokenizers.train", description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--input", nargs="+", default=[], metavar="PATH",
                        help="caption text files (one caption a line), image-text folders and/or WebDataset shards "
                             "(.tar: the txt of every sample with an image) (default: none; give "
                             "this and/or --dataset)")
    parser.add_argument("--dataset", choices=BUILTIN_DATASETS, action="append", default=[],
                        help="add a built-in dataset's training captions (shapes: every caption of the grammar, "
                             "the recipe of the shipped shapes.model; emoji: the training split's names; repeatable)")
    parser.add_argument("--shapes", action="store_true", help="the same as --dataset shapes")
    parser.add_argument("--vocab_size", type=int, required=True,
                        help="most tokens in the vocabulary, pad/unk/bos/eos included")
    parser.add_argument("--output", required=True,
                        help="the vocabulary file to write: *.model (youtokentome) or *.json (HuggingFace tokenizers)")
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="youtokentome or HuggingFace tokenizers (default: from the --output suffix)")
    parser.add_argument("--text_seq_len", type=int, default=24,
                        help="only for the report: how many captions would not fit this context")
    parser.add_argument("--verbose", action="store_true", help="show youtokentome's own training log")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    datasets = list(dict.fromkeys(args.dataset + (["shapes"] if args.shapes else [])))
    if not args.input and not datasets:
        build_parser().error("give --input PATH [PATH ...] and/or --dataset shapes|emoji")

    sources: list = [Path(p) for p in args.input]
    # a built-in vocabulary also spells out any ASCII word letter by letter, so no prompt is lost to <unk>
    extra_characters = SPELLING_CHARACTERS if datasets else ""
    try:
        for name in datasets:
            sources += builtin_vocabulary_captions(name)
        captions = collect_captions(sources)
        tokenizer = train_bpe(captions, args.vocab_size, args.output, backend=args.backend,
                              extra_characters=extra_characters, verbose=args.verbose)
        lengths = caption_lengths(tokenizer, captions)
    except (ValueError, FileNotFoundError, RuntimeError, ImportError) as error:
        print(f"python -m dalle_lab.tokenizers.train: error: {error}", file=sys.stderr)
        return 2

    too_long = sum(length > args.text_seq_len for length in lengths)
    print(f"wrote {os.fspath(args.output)} ({tokenizer.kind}): {tokenizer.vocab_size} tokens"
          + (f" (asked for {args.vocab_size}; the captions allow no more merges)"
             if tokenizer.vocab_size < args.vocab_size else ""))
    print(f"{len(lengths)} captions: {max(lengths)} tokens at most, {sum(lengths) / len(lengths):.1f} on average; "
          f"{too_long} longer than --text_seq_len {args.text_seq_len}")
    print(f"use it with --bpe_path {os.fspath(args.output)} (the model needs num_text_tokens >= {tokenizer.vocab_size})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
