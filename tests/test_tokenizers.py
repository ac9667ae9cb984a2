"""Text tokenizers: the shipped Shapes vocabulary, padding/truncation, special ids, HF json files, identity."""
import json

import pytest
import torch

from dalle_lab.data.shapes import all_captions
from dalle_lab.tokenizers import (
    PAD_ID,
    UNK_ID,
    check_vocab_fits,
    get_tokenizer,
    load_tokenizer,
    normalize_caption,
    train_bpe,
)
from dalle_lab.tokenizers import loading

DEFAULT_TEXT_SEQ_LEN = 24  # DALLEConfig's default text context


@pytest.fixture(scope="module")
def shapes_tok():
    return get_tokenizer()


def test_default_vocab_loads_from_any_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tok = get_tokenizer(None)
    assert tok.kind == "yttm"
    assert tok.path == loading.DEFAULT_BPE_PATH
    assert tok.vocab_size <= 256


def test_missing_default_vocab_says_how_to_rebuild(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "DEFAULT_BPE_PATH", tmp_path / "bpe" / "shapes.model")
    with pytest.raises(FileNotFoundError, match="dalle_lab.tokenizers.train --dataset shapes"):
        get_tokenizer()


def test_every_shapes_caption_is_one_token_per_word_and_round_trips(shapes_tok):
    captions = all_captions()
    encoded = shapes_tok.encode_batch(captions)
    assert [len(ids) for ids in encoded] == [len(c.split()) for c in captions]
    assert max(len(ids) for ids in encoded) <= 20
    rows = shapes_tok.tokenize(captions, DEFAULT_TEXT_SEQ_LEN)  # raises if any caption did not fit
    assert rows.shape == (len(captions), DEFAULT_TEXT_SEQ_LEN)
    assert not any(UNK_ID in ids or PAD_ID in ids for ids in encoded)
    for caption, row in zip(captions[::97], rows[::97]):
        assert shapes_tok.decode(row) == caption


def test_tokenize_pads_with_zero_after_the_caption(shapes_tok):
    caption = "a red circle above a blue square on a gray background"
    ids = shapes_tok.encode(caption)
    rows = shapes_tok.tokenize([caption, "a red circle"], 16)
    assert rows.dtype == torch.long and rows.shape == (2, 16)
    assert rows[0, : len(ids)].tolist() == ids
    assert (rows[0, len(ids) :] == PAD_ID).all()
    assert (rows[1, :3] != PAD_ID).all() and (rows[1, 3:] == PAD_ID).all()
    # A single string is a batch of one.
    assert torch.equal(shapes_tok.tokenize(caption, 16), rows[:1])


def test_too_long_caption_names_it_unless_truncating(shapes_tok):
    caption = "a small red circle at the top left on a white background"  # 11 tokens
    with pytest.raises(ValueError) as info:
        shapes_tok.tokenize(["a red circle", caption], 8)
    message = str(info.value)
    assert caption in message and "--truncate_captions" in message and "--text_seq_len" in message
    row = shapes_tok.tokenize([caption], 8, truncate_text=True)[0]
    assert row.tolist() == shapes_tok.encode(caption)[:8]
    assert shapes_tok.decode(row) == "a small red circle at the top left"


def test_normalisation_lowercases_and_collapses_whitespace(shapes_tok):
    assert normalize_caption("  A   Red\tCircle\n") == "a red circle"
    assert shapes_tok.encode("  A   RED\tcircle ") == shapes_tok.encode("a red circle")


@pytest.mark.parametrize("empty", ["", "   ", "\n\t"])
def test_empty_caption_is_an_all_pad_row(shapes_tok, empty):
    assert shapes_tok.encode(empty) == []
    assert shapes_tok.tokenize([empty], 5).tolist() == [[PAD_ID] * 5]


def test_unknown_characters_become_unk_and_ascii_is_spelled(shapes_tok):
    # Words outside the grammar are spelled from the shipped ASCII alphabet, so they survive a round trip.
    assert shapes_tok.unknown_characters("a fuzzy zebra, 42 quokkas!") == set()
    assert shapes_tok.decode(shapes_tok.encode("a fuzzy zebra, 42 quokkas!")) == "a fuzzy zebra, 42 quokkas!"
    # Characters it has never seen become unk (id 1): visible in the ids and in the decoded text, never dropped.
    assert shapes_tok.unknown_characters("a red ☃ circle") == {"☃"}
    ids = shapes_tok.encode("a red ☃ circle")
    assert UNK_ID in ids and PAD_ID not in ids
    assert shapes_tok.decode(ids) == "a red <UNK> circle"


def test_pad_id_zero_is_never_emitted(shapes_tok):
    every_char = "".join(chr(c) for c in range(32, 127)) + "é☃"
    assert PAD_ID not in shapes_tok.encode(every_char)
    assert PAD_ID not in shapes_tok.encode(" ".join(every_char))


def test_check_vocab_fits(shapes_tok):
    check_vocab_fits(shapes_tok, shapes_tok.vocab_size)  # exactly enough rows is fine
    with pytest.raises(ValueError, match=f"at least {shapes_tok.vocab_size}"):
        check_vocab_fits(shapes_tok, shapes_tok.vocab_size - 1)


def test_identity_changes_with_the_file_and_is_checked_on_reload(tmp_path):
    path = tmp_path / "v.model"
    first = train_bpe(["a red circle", "a blue square"], 30, path)
    identity = first.identity
    assert identity["kind"] == "yttm" and identity["path"] == str(path.resolve()) and len(identity["sha256"]) == 64
    assert load_tokenizer(identity).encode("a red circle") == first.encode("a red circle")

    second = train_bpe(["a green triangle", "a purple circle"], 30, path)
    assert second.identity["sha256"] != identity["sha256"]
    with pytest.raises(ValueError, match="has changed since the checkpoint"):
        load_tokenizer(identity)


def test_identity_of_the_default_vocab_resolves_on_another_machine(shapes_tok):
    moved = dict(shapes_tok.identity, path="/elsewhere/bpe/shapes.model")
    assert load_tokenizer(moved).path == shapes_tok.path


def _save_hf(tokenizer, path):
    tokenizer.save(str(path))
    return path


def test_hf_json_trained_here_keeps_pad_at_zero(tmp_path):
    tok = train_bpe(["a red circle", "a blue square", "a green triangle"] * 5, 60, tmp_path / "v.json")
    assert tok.kind == "hf" and tok.id_offset == 0
    assert json.loads((tmp_path / "v.json").read_text())["added_tokens"][0]["content"] == "<PAD>"
    ids = tok.encode("A Red Square")
    assert PAD_ID not in ids and tok.decode(ids) == "a red square"
    assert tok.decode(tok.tokenize("a blue circle", 10)[0]) == "a blue circle"
    ids = tok.encode("a red ☃")
    assert UNK_ID in ids and tok.decode(ids) == "a red <UNK>"


def test_foreign_hf_json_is_shifted_so_pad_stays_zero(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"a": 0, "red": 1, "circle": 2, "[UNK]": 3}
    foreign = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    foreign.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = get_tokenizer(_save_hf(foreign, tmp_path / "foreign.json"))
    assert tok.id_offset == 1 and tok.vocab_size == len(vocab) + 1
    assert tok.encode("a red circle") == [1, 2, 3]  # file ids 0, 1, 2 shifted by one
    assert tok.decode(tok.tokenize("a red circle", 6)[0]) == "a red circle"
    assert tok.encode("a blue circle") == [1, 4, 3]  # unk (file id 3) shifted too
    assert tok.unknown_characters("a blue circle") == set()  # a word-level file has no alphabet to check


def test_hf_json_without_unk_refuses_characters_it_would_drop(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    no_unk = Tokenizer(models.BPE())
    no_unk.pre_tokenizer = pre_tokenizers.Metaspace()
    no_unk.train_from_iterator(["a red circle"], trainers.BpeTrainer(vocab_size=40, show_progress=False))
    tok = get_tokenizer(_save_hf(no_unk, tmp_path / "no_unk.json"))
    assert tok.id_offset == 1 and PAD_ID not in tok.encode("a red circle")
    with pytest.raises(ValueError, match="'z'.*no unk token"):
        tok.encode("a red czar")


def test_bad_files_get_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        get_tokenizer(tmp_path / "missing.model")
    garbage = tmp_path / "garbage.model"
    garbage.write_text("hello world\n")
    with pytest.raises(ValueError, match="garbage.model is not a youtokentome BPE model"):
        get_tokenizer(garbage)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"model": 3}')
    with pytest.raises(ValueError, match="bad.json is not a HuggingFace tokenizers file"):
        get_tokenizer(bad_json)


@pytest.mark.parametrize("suffix", [".model", ".json"])
def test_tokenizers_pickle_for_dataloader_workers(tmp_path, suffix):
    import pickle

    tok = train_bpe(["a red circle", "a blue square"], 40, tmp_path / f"v{suffix}")
    copy = pickle.loads(pickle.dumps(tok))
    assert type(copy) is type(tok) and copy.identity == tok.identity
    assert copy.encode("a red square") == tok.encode("a red square")


def test_hf_pad_token_text_inside_a_caption_is_refused(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "[UNK]": 1, "a": 2, "cat": 3}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["<pad>"])
    tok = get_tokenizer(_save_hf(tokenizer, tmp_path / "padded.json"))
    assert tok.id_offset == 0 and tok.encode("a cat") == [2, 3]
    with pytest.raises(ValueError, match="pad token"):
        tok.encode("a <pad> cat")


def test_byte_level_hf_json_spells_anything(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    byte_level = Tokenizer(models.BPE())
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    byte_level.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    byte_level.train_from_iterator(["a red circle", "a blue square"], trainer)
    tok = get_tokenizer(_save_hf(byte_level, tmp_path / "bytes.json"))
    assert tok.id_offset == 1 and tok.unknown_characters("a red ☃") == set()
    ids = tok.encode("a red ☃")
    assert PAD_ID not in ids and tok.decode(ids) == "a red ☃"
