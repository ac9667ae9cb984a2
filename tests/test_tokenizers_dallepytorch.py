"""DALLE-pytorch's tokenizers as reproduced in dalle_lab.tokenizers.dallepytorch, on files made here (CLIP's real
merges file is compared against dalle-pytorch itself in tests/test_convert_reference.py)."""
from __future__ import annotations

import gzip
import json

import pytest

from dalle_lab.tokenizers import load_tokenizer
from dalle_lab.tokenizers.dallepytorch import (SIMPLE_VOCAB_SIZE, DallePytorchHug, DallePytorchYttm, SimpleTokenizer,
                                              dallepytorch_tokenizer)

MERGES = ["h e", "l l", "he ll", "hell o</w>", "c a", "ca t</w>"]


def clip_style_merges(path, gz=False):
    """A merges file of CLIP's shape: a version line, then as many merges as CLIP's vocabulary keeps (the first
    few real, the rest filler that no caption reaches)."""
    filler = [f"q{i} z{i}" for i in range(SIMPLE_VOCAB_SIZE - 512 - 2 - len(MERGES))]
    text = "\n".join(["#version: 0.2", *MERGES, *filler]) + "\n"
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_simple_tokenizer_cleans_lowercases_and_merges_as_clip(tmp_path, gz):
    tok = SimpleTokenizer(clip_style_merges(tmp_path / ("m.txt.gz" if gz else "m.txt"), gz=gz))
    ids = tok.ids
    assert tok.vocab_size == SIMPLE_VOCAB_SIZE == len(tok.tokens)
    # "HELLO" lower-cased and merged to one token; "&amp;" unescaped; digits split one by one; "cat" merged
    assert tok.encode("  HELLO\n&amp;amp; 42 cat ") == [ids["hello</w>"], ids["&</w>"], ids["4</w>"], ids["2</w>"],
                                                         ids["cat</w>"]]
    assert tok.encode("hellos") == [ids["hell"], ids["o"], ids["s</w>"]]  # no merge learnt for "o s</w>"
    assert tok.decode(tok.tokenize(["Hello cat"], 6)[0]) == "hello cat"
    assert tok.encode("é")[0] == ids[bytes([0xC3]).decode("latin-1")]  # UTF-8 bytes as byte symbols


def test_a_file_that_is_not_clips_merges_is_refused_in_one_line(tmp_path):
    (tmp_path / "short.txt").write_text("#version: 0.2\na b\n")
    with pytest.raises(ValueError, match=r"short.txt is not CLIP's BPE merges file"):
        SimpleTokenizer(tmp_path / "short.txt")


def test_yttm_keeps_the_caption_as_given(tmp_path):
    from dalle_lab.tokenizers import train_bpe

    ours = train_bpe(["a red circle", "A Red Circle"], 60, tmp_path / "v.model")
    theirs = DallePytorchYttm(ours.path)
    assert theirs.encode("A Red") != theirs.encode("a red")  # DALLE-pytorch did not lower-case
    assert ours.encode("A Red") == ours.encode("a red")  # dalle_lab's own reading does
    assert dallepytorch_tokenizer(ours.path).kind == "dallepytorch_yttm"
    assert load_tokenizer(theirs.identity).encode("A Red") == theirs.encode("A Red")


def test_hug_keeps_the_files_ids_and_bytelevel_post_processing(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "a": 1, "b": 2, "ab": 3}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "v.json"))
    hug = dallepytorch_tokenizer(tmp_path / "v.json", hug=True)
    assert isinstance(hug, DallePytorchHug) and hug.vocab_size == 4
    assert hug.encode("ab a") == [3, 1]  # the file's own ids: no pad shift
    json.loads((tmp_path / "v.json").read_text())  # the file is left as it was


def test_missing_vocabulary_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope.txt does not exist: pass the --bpe_path"):
        dallepytorch_tokenizer(tmp_path / "nope.txt")
