"""Finding and loading a text tokenizer: by path (`--bpe_path`), the shipped default, or a checkpoint's record."""
from __future__ import annotations

import os
from pathlib import Path

from dalle_lab.assets import BPE_DIR
from dalle_lab.tokenizers.base import TextTokenizer
from dalle_lab.tokenizers.dallepytorch import KINDS as DALLEPYTORCH_KINDS
from dalle_lab.tokenizers.hf_backend import HFTokenizer
from dalle_lab.tokenizers.yttm_backend import YttmTokenizer

# The shipped vocabularies are package data (dalle_lab/assets/bpe/), so an installed wheel has them too.
DEFAULT_BPE_PATH = BPE_DIR / "shapes.model"
# The shipped vocabulary of each built-in dataset (dalle_lab/assets/bpe/<dataset>.model) and the command that
# rebuilds it (run from the repository root: it writes the file the package ships).
SHIPPED_VOCAB_SIZES = {"shapes": 256, "emoji": 1024}


def rebuild_command(dataset: str) -> str:
    return (f"python -m dalle_lab.tokenizers.train --dataset {dataset} --vocab_size {SHIPPED_VOCAB_SIZES[dataset]} "
            f"--output dalle_lab/assets/bpe/{dataset}.model")


def shipped_bpe_path(dataset: str) -> Path:
    return DEFAULT_BPE_PATH if dataset == "shapes" else BPE_DIR / f"{dataset}.model"


def default_bpe_path(dataset: str = "shapes") -> Path:
    """The shipped vocabulary for a built-in dataset's captions, with a clear error when it is missing."""
    if dataset not in SHIPPED_VOCAB_SIZES:
        raise ValueError(f"no shipped vocabulary for dataset {dataset!r} (have: {', '.join(SHIPPED_VOCAB_SIZES)}); "
                         "pass --bpe_path")
    path = shipped_bpe_path(dataset)
    if not path.is_file():
        raise FileNotFoundError(
            f"the default text vocabulary {path} is missing. It ships inside the package: reinstall dalle_lab, "
            f"pass your own vocabulary with --bpe_path, or rebuild it from a checkout with "
            f"`{rebuild_command(dataset)}`"
        )
    return path


def backend_for(path: str | os.PathLike) -> str:
    """"hf" for HuggingFace tokenizers JSON files, "yttm" otherwise: by suffix, else by a peek at the content."""
    path = Path(path)
    if path.suffix == ".json":
        return "hf"
    if path.suffix == ".model":
        return "yttm"
    with open(path, "rb") as handle:
        return "hf" if handle.read(64).lstrip().startswith(b"{") else "yttm"


def get_tokenizer(bpe_path: str | os.PathLike | None = None, dataset: str = "shapes") -> TextTokenizer:
    """Load a youtokentome `.model` or HuggingFace tokenizers `.json` vocabulary; None loads the shipped
    vocabulary of the built-in `dataset` (`shapes.model`, `emoji.model` in dalle_lab/assets/bpe/)."""
    path = default_bpe_path(dataset) if bpe_path is None else Path(bpe_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"text vocabulary {path} does not exist (--bpe_path). Pass a youtokentome .model or HuggingFace "
            f"tokenizers .json file, or train one: python -m dalle_lab.tokenizers.train --input CAPTIONS "
            f"--vocab_size 2000 --output {path.name if path.suffix else 'my.model'}"
        )
    if backend_for(path) == "hf":
        return HFTokenizer(path)
    return YttmTokenizer(path)


def load_tokenizer(identity: dict) -> TextTokenizer:
    """Rebuild the tokenizer a checkpoint recorded (`tokenizer.identity`) and check it is the same file.

    When the recorded path does not exist here (a checkpoint from another machine) but the hash is one of the
    shipped vocabularies', that shipped file is used.
    """
    path, sha256 = Path(identity["path"]), identity.get("sha256")
    if identity.get("kind") in DALLEPYTORCH_KINDS:  # a model converted from DALLE-pytorch reads text as it did
        if not path.is_file():
            raise FileNotFoundError(f"the checkpoint's text vocabulary {path} (DALLE-pytorch's "
                                    f"{identity['kind']}) does not exist on this machine; copy that file here and "
                                    "pass it with --bpe_path")
        tokenizer = DALLEPYTORCH_KINDS[identity["kind"]](path)
        if sha256 is not None and tokenizer.sha256 != sha256:
            raise ValueError(f"text vocabulary {path} is not the file the checkpoint recorded (sha256 "
                             f"{tokenizer.sha256[:12]}... now, {sha256[:12]}... recorded): pass the original with "
                             "--bpe_path")
        return tokenizer
    if not path.is_file():
        for dataset in SHIPPED_VOCAB_SIZES:
            shipped = shipped_bpe_path(dataset)
            if shipped.is_file() and (tokenizer := get_tokenizer(shipped)).sha256 == sha256:
                return tokenizer
    if not path.is_file():
        raise FileNotFoundError(
            f"the checkpoint's text vocabulary {path} does not exist on this machine; copy that file here and "
            f"pass it with --bpe_path"
        )
    tokenizer = get_tokenizer(path)
    if sha256 is not None and tokenizer.sha256 != sha256:
        raise ValueError(
            f"text vocabulary {path} has changed since the checkpoint was written (sha256 {tokenizer.sha256[:12]}... "
            f"now, {sha256[:12]}... recorded): its ids would not match the model. Pass the original file with "
            f"--bpe_path"
        )
    return tokenizer


def is_shipped_vocabulary(tokenizer: TextTokenizer, dataset: str = "shapes") -> bool:
    """Whether the tokenizer is the built-in dataset's shipped vocabulary (by sha256): a model of that data, not of
    the user's own captions (what the Shapes prompts, checker and quality scores assume)."""
    path = shipped_bpe_path(dataset)
    return path.is_file() and tokenizer.sha256 == get_tokenizer(path).sha256


def check_vocab_fits(tokenizer: TextTokenizer, num_text_tokens: int) -> None:
    """Raise when the tokenizer can emit ids the model's text embedding (num_text_tokens rows) cannot hold."""
    if tokenizer.vocab_size > num_text_tokens:
        raise ValueError(
            f"text vocabulary {tokenizer.path} has {tokenizer.vocab_size} tokens but the model's num_text_tokens "
            f"is {num_text_tokens}, so its larger ids would fall outside the text embedding. Set num_text_tokens "
            f"to at least {tokenizer.vocab_size}, or train a smaller vocabulary "
            f"(python -m dalle_lab.tokenizers.train --vocab_size ...)"
        )
