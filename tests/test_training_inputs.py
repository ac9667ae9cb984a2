"""Bad inputs caught before hours are lost: captions longer than text_seq_len (before step 1), words the vocabulary
does not know (warned), checkpoints whose config and weights disagree (one line)."""
import pytest
import torch

from dalle_lab.training.checkpoint import CheckpointError
from dalle_lab.training.loop import train

from test_training import tiny_config

TINY = dict(dim=32, depth=1, heads=2, dim_head=16, null_cond_prob=0.0, text_seq_len=8)
SHAPES_TINY = {k: v for k, v in TINY.items() if k != "text_seq_len"}  # Shapes captions need the default length
LONG = "a red circle above a blue square left of a green triangle below a small yellow star"


def folder_with(path, captions):
    """One Shapes image per entry; each entry is the caption file's text."""
    from PIL import Image

    from dalle_lab.data.shapes import ShapesDataset
    from dalle_lab.image_grid import to_uint8

    path.mkdir(parents=True)
    shapes = ShapesDataset(length=len(captions), seed=2)
    for i, text in enumerate(captions):
        Image.fromarray(to_uint8(shapes[i][0][None])[0]).save(path / f"{i}.png")
        (path / f"{i}.txt").write_text(text)
    return path


def test_a_long_caption_is_an_error_naming_its_file_before_step_1(tiny_vqgan, tmp_path):
    folder = folder_with(tmp_path / "data", ["a red circle\n", f"a blue square\n{LONG}\n", "a green star\n"])
    with pytest.raises(ValueError) as err:
        train(tiny_config(tiny_vqgan, tmp_path / "run", image_text_folder=str(folder), batch_size=1), TINY)
    message = str(err.value)
    assert f"{folder / '1.txt'}, line 2" in message and "tokens long but text_seq_len is 8" in message
    assert "--truncate_captions" in message and "--skip_long_captions" in message
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").iterdir())  # nothing trained


def test_a_shapes_caption_longer_than_the_text_context_is_an_error_before_step_1(tiny_vqgan, tmp_path, monkeypatch):
    """The Shapes stream is endless but its grammar finite: every caption it can draw is checked up front."""
    from dalle_lab.model import DALLE

    forwards = []
    original = DALLE.forward
    monkeypatch.setattr(DALLE, "forward", lambda self, *a, **kw: forwards.append(1) or original(self, *a, **kw))
    short_context = {**SHAPES_TINY, "text_seq_len": 6}
    with pytest.raises(ValueError) as err:
        train(tiny_config(tiny_vqgan, tmp_path / "a", max_steps=1), short_context)
    message = str(err.value)
    assert message.startswith("the built-in Shapes data: caption '") and "tokens long but text_seq_len is 6" in message
    assert "captions are longer): pass --truncate_captions to cut them, or --text_seq_len 12" in message
    assert "\n" not in message and not forwards  # before step 1
    with pytest.raises(ValueError, match="--skip_long_captions cannot leave captions out of this stream"):
        train(tiny_config(tiny_vqgan, tmp_path / "b", max_steps=1, skip_long_captions=True), short_context)
    assert train(tiny_config(tiny_vqgan, tmp_path / "c", max_steps=1, truncate_captions=True), short_context).step == 1


def test_truncate_cuts_and_skip_leaves_out_and_reports(tiny_vqgan, tmp_path, capsys, caplog):
    folder = folder_with(tmp_path / "data", ["a red circle\n", f"a blue square\n{LONG}\n", f"{LONG}\n",
                                             "a green star\n"])
    (folder / "nocaption.png").write_bytes((folder / "0.png").read_bytes())  # so the folder has a report to say
    cut = train(tiny_config(tiny_vqgan, tmp_path / "cut", image_text_folder=str(folder), batch_size=1, max_steps=4,
                            truncate_captions=True), TINY)
    assert cut.step == 4
    capsys.readouterr()
    skipped = train(tiny_config(tiny_vqgan, tmp_path / "skip", image_text_folder=str(folder), batch_size=1,
                                max_steps=None, epochs=1, skip_long_captions=True), TINY)
    assert skipped.step == 3  # 2.png had only the long caption: left out, like a corrupt image
    err = capsys.readouterr().err
    assert ("--skip_long_captions left out 2 caption line(s) longer than text_seq_len 8, and 1 image(s) left with "
            "no caption (2.png): 3 usable image-caption pairs remain") in err
    assert err.count("image(s) without a caption file, left out (nocaption.png)") == 1  # the report is said once
    with pytest.raises(ValueError, match="give one of them"):
        train(tiny_config(tiny_vqgan, tmp_path / "both", image_text_folder=str(folder), truncate_captions=True,
                          skip_long_captions=True), TINY)


def test_long_captions_in_shards_are_named_or_skipped(tmp_path, caplog):
    import io

    import webdataset as wds
    from PIL import Image

    from dalle_lab.data.wds import webdataset_dataset
    from dalle_lab.tokenizers import get_tokenizer
    from dalle_lab.training.captions import LongCaptionCheck

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 0, 0)).save(buffer, "png")
    path = str(tmp_path / "shard.tar")
    with wds.TarWriter(path) as sink:
        sink.write({"__key__": "short", "png": buffer.getvalue(), "txt": b"a red circle"})
        sink.write({"__key__": "long", "png": buffer.getvalue(), "txt": LONG.encode()})
    tokenizer = get_tokenizer(None, "shapes")
    kept = [c for _, c in webdataset_dataset([path], image_size=8, rank=0, world_size=1,
                                            long_captions=LongCaptionCheck(tokenizer, 8, "skip"))]
    assert kept == ["a red circle"] and "long: caption of" in caplog.text
    with pytest.raises(ValueError, match=r"shard sample .*shard.tar:long: caption .* text_seq_len is 8") as error:
        list(webdataset_dataset([path], image_size=8, rank=0, world_size=1,
                                long_captions=LongCaptionCheck(tokenizer, 8, "error")))
    # shards are a stream: --text_seq_len auto is refused for them, so the advice must not offer it
    assert "--skip_long_captions" in str(error.value) and "auto" not in str(error.value)


def test_shard_paths_are_checked_before_anything_is_built(tmp_path):
    """A missing shard is named (the first one) and a .tar without --wds says to add it, both from the flags
    alone, before a tokenizer or model exists."""
    from dalle_lab.training.config import TrainConfig
    from dalle_lab.training.sources import check_data_flags

    pattern = str(tmp_path / "nope" / "{000..001}.tar")
    with pytest.raises(FileNotFoundError, match=r"nope/000.tar does not exist"):
        check_data_flags(TrainConfig(image_text_folder=pattern, wds="png,txt"))
    shard = tmp_path / "000.tar"
    shard.write_bytes(b"")
    for given in (str(shard), str(tmp_path / "{000..001}.tar")):
        with pytest.raises(ValueError, match=r"names WebDataset shards, not a folder: add --wds"):
            check_data_flags(TrainConfig(image_text_folder=given))
    check_data_flags(TrainConfig(image_text_folder=str(tmp_path), wds="png,txt"))  # a folder of shards is fine


def test_training_counts_unknown_words_per_caption_file(tiny_vqgan, tmp_path, capsys):
    folder = folder_with(tmp_path / "data", ["a red zebra\n", "a zebra\na blue qwxz\n", "a green circle\n"])
    train(tiny_config(tiny_vqgan, tmp_path / "run", image_text_folder=str(folder), batch_size=1, max_steps=1), TINY)
    err = capsys.readouterr().err
    assert "warning: 2 of 3 caption files use words the text vocabulary does not know: 'zebra' (2 files), " \
           "'qwxz' (1 file)" in err


def test_generate_names_the_words_the_vocabulary_never_saw(tiny_vqgan, tmp_path, capsys):
    from test_cli import script_main

    result = train(tiny_config(tiny_vqgan, tmp_path / "run", max_steps=1), SHAPES_TINY)
    capsys.readouterr()
    assert script_main("generate.py", "--dalle_path", result.checkpoint_path, "--text",
                       "a violet hexagon under the moon|a red circle", "--num_images", "1", "--truncate_captions",
                       "--outputs_dir", tmp_path / "out") == 0
    err = capsys.readouterr().err
    assert "'a violet hexagon under the moon': violet, hexagon, under, moon" in err
    assert "'a red circle'" not in err  # known words: nothing to say
    assert (tmp_path / "out" / "a_violet_hexagon_under_the_moon" / "0.png").is_file()  # generated all the same


def test_a_checkpoint_whose_config_and_weights_disagree_is_a_one_line_error(tiny_vqgan, tmp_path):
    from dalle_lab.training.checkpoint import load_dalle, save_checkpoint

    result = train(tiny_config(tiny_vqgan, tmp_path / "run", max_steps=1), SHAPES_TINY)
    ckpt = torch.load(result.checkpoint_path, weights_only=True)
    ckpt["config"]["dim"] = 48  # an edited config: the weights are still dim 32
    bad = tmp_path / "bad.pt"
    save_checkpoint(ckpt, bad)
    with pytest.raises(CheckpointError) as err:
        load_dalle(bad)
    message = str(err.value)
    assert message.startswith(f"{bad}: its config and its weights disagree") and "\n" not in message
    assert "dim=48" in message and "32" in message


def test_one_vqgan_file_on_own_data_asks_for_both_not_neither(tmp_path):
    """"Neither" means the built-in data's image tokenizer, which cannot draw a user's images."""
    from dalle_lab.training.config import TrainConfig
    from dalle_lab.training.sources import check_data_flags

    folder = str(tmp_path)
    with pytest.raises(ValueError, match=r"^--vqgan_model_path needs --vqgan_config_path \(.yaml\) too: give both") as e:
        check_data_flags(TrainConfig(image_text_folder=folder, vqgan_model_path="vqgan.ckpt"))
    assert "neither" not in str(e.value)
    with pytest.raises(ValueError, match=r"^--vqgan_config_path needs --vqgan_model_path \(.ckpt\) too: give both"):
        check_data_flags(TrainConfig(image_text_folder=folder, vqgan_config_path="vqgan.yaml"))
