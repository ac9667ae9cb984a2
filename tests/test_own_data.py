"""The user's own data: no silent toy defaults (what is missing is named with the commands that make it),
--bpe_path auto, --text_seq_len auto, and long-caption errors that blame the vocabulary when it is the cause."""
import pytest
import torch

from dalle_lab.tokenizers import DEFAULT_BPE_PATH
from dalle_lab.training.config import TrainConfig
from dalle_lab.training.errors import MissingTokenizerError
from dalle_lab.training.loop import train
from dalle_lab.training.tokenizer_choice import auto_vocab_size, check_user_data_has_tokenizers

from own_data_folder import make_photos
from test_cli import TINY_FLAGS, script_main, vqgan_flags

TINY = dict(dim=32, depth=1, heads=2, dim_head=16, null_cond_prob=0.0)


def settings(tmp_path, **overrides) -> TrainConfig:
    return TrainConfig(**{**dict(batch_size=4, max_steps=2, warmup_steps=1, output_dir=str(tmp_path / "run"),
                                 save_every_n_steps=0, sample_every_n_steps=0, progress=False), **overrides})


@pytest.mark.parametrize("given,named,not_named", [
    ({}, ["no text vocabulary (--bpe_path) and no image tokenizer", "--bpe_path auto", "train_vae.py --data"], []),
    ({"bpe_path": "my.model"}, ["no image tokenizer", "dalle_lab.vae.fetch vqgan_imagenet_f16_1024"],
     ["no text vocabulary"]),
    ({"vqgan_model_path": "v.ckpt", "vqgan_config_path": "v.yaml"}, ["no text vocabulary", "--bpe_path auto"],
     ["image tokenizer:"]),
    ({"wds": "jpg,txt"}, ["no text vocabulary", "python -m dalle_lab.tokenizers.train --input captions.txt"],
     ["--bpe_path auto"]),
])
def test_own_data_without_a_vocabulary_or_image_tokenizer_names_what_is_missing(given, named, not_named):
    cfg = TrainConfig(image_text_folder="photos", **given)
    with pytest.raises(MissingTokenizerError) as error:
        check_user_data_has_tokenizers(cfg, None)
    for text in named:
        assert text in str(error.value)
    for text in not_named:
        assert text not in str(error.value)


def test_built_in_data_checkpoints_and_given_objects_keep_their_tokenizers():
    check_user_data_has_tokenizers(TrainConfig(), None)  # the built-in Shapes data: its own
    check_user_data_has_tokenizers(TrainConfig(dataset="emoji"), None)
    check_user_data_has_tokenizers(TrainConfig(image_text_folder="photos"), {"tokenizer": {}, "vae": {}})
    check_user_data_has_tokenizers(TrainConfig(image_text_folder="photos"), None, given_text=True, given_vae=True)


def test_the_command_line_stops_before_step_1_and_taming_without_files_is_an_error(tiny_vqgan, tmp_path, capsys):
    photos = make_photos(tmp_path / "photos", n=8) and tmp_path / "photos"
    out = tmp_path / "out"
    assert script_main("train_dalle.py", "--image_text_folder", photos, "--output_dir", out, *TINY_FLAGS) == 1
    assert "no text vocabulary (--bpe_path) and no image tokenizer" in capsys.readouterr().err
    assert not out.exists()  # nothing written, nothing trained
    assert script_main("train_dalle.py", "--image_text_folder", photos, "--taming", "--bpe_path", "auto",
                       "--output_dir", out) == 2
    err = capsys.readouterr().err
    assert err.startswith("train_dalle.py: error: --taming without --vqgan_model_path/--vqgan_config_path")
    assert "nothing downloads during a run here" in err and err.count("\n") == 1
    # built-in data: --taming is a note, not an error
    assert script_main("train_dalle.py", "--taming", *vqgan_flags(tiny_vqgan), *TINY_FLAGS, "--max_steps", "1",
                       "--batch_size", "2", "--output_dir", tmp_path / "shapes") == 0


def test_a_caption_too_long_because_of_the_vocabulary_says_so_instead_of_suggesting_truncation(tiny_vqgan, tmp_path):
    photos = make_photos(tmp_path / "photos", n=8) and tmp_path / "photos"
    ckpt, yaml = tiny_vqgan
    cfg = settings(tmp_path, image_text_folder=str(photos), bpe_path=str(DEFAULT_BPE_PATH),
                   vqgan_model_path=str(ckpt), vqgan_config_path=str(yaml))
    with pytest.raises(ValueError) as error:
        train(cfg, {**TINY, "text_seq_len": 12})
    message = str(error.value)
    assert "because the text vocabulary" in message and "does not know" in message and "'zorblat'" in message
    assert "--bpe_path auto" in message and "--truncate_captions" not in message
    assert "\n" not in message


def test_auto_vocab_size_grows_with_the_caption_count_within_its_limits():
    assert [auto_vocab_size(n, 30) for n in (1, 40, 10_000, 10**6, 10**8)] == [512, 512, 6400, 16384, 16384]
    assert auto_vocab_size(40, 600) == 600  # never fewer tokens than the captions' characters need


class LengthTokenizer:
    """Stand-in: a caption of n characters is n tokens."""

    def encode_batch(self, captions):
        return [[1] * len(c) for c in captions]


def test_text_seq_len_auto_uses_the_longest_or_with_skip_or_truncate_the_p99(capsys):
    from dalle_lab.training.captions import auto_text_seq_len

    captions = [(f"c{i}.txt, line 1", "x" * 5) for i in range(99)] + [("long.txt, line 2", "y" * 40)]
    said = []
    assert auto_text_seq_len(captions, LengthTokenizer(), "error", said.append) == 40
    assert said[0].startswith("--text_seq_len auto: 100 captions of 5-40 tokens (median 5, p99 5, max 40): "
                              "text_seq_len 40, the longest") and len(said) == 1
    said.clear()
    assert auto_text_seq_len(captions, LengthTokenizer(), "skip", said.append) == 8
    assert "p99 rounded up" in said[0]
    assert said[1].startswith("--text_seq_len auto: 1 of 100 captions are longer than 8 tokens and will be left out "
                              "(e.g. long.txt, line 2: 'yyyy")
    said.clear()
    auto_text_seq_len(captions, LengthTokenizer(), "truncate", said.append)
    assert "will be cut" in said[1]


def test_bpe_path_auto_trains_saves_records_and_a_resume_reuses_it(tiny_vqgan, tmp_path, capsys):
    from dalle_lab.utils import file_sha256

    photos = make_photos(tmp_path / "photos", n=12) and tmp_path / "photos"
    ckpt, yaml = tiny_vqgan
    cfg = settings(tmp_path, image_text_folder=str(photos), bpe_path="auto", vqgan_model_path=str(ckpt),
                   vqgan_config_path=str(yaml), max_steps=3)
    train(cfg, {**TINY, "text_seq_len": "auto"}, stop_at_step=1)
    vocab = tmp_path / "run" / "dalle-bpe.model"
    saved = torch.load(tmp_path / "run" / "dalle.pt", weights_only=True)
    assert saved["tokenizer"]["path"] == str(vocab.resolve()) and saved["tokenizer"]["sha256"] == file_sha256(vocab)
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"vocabulary: {vocab.resolve()} (") and "trained here on the 15 caption lines" in first
    before = vocab.stat().st_mtime_ns
    result = train(TrainConfig(**{**cfg.to_dict(), "resume": "latest"}), {**TINY, "text_seq_len": "auto"})
    assert result.step == 3 and vocab.stat().st_mtime_ns == before  # not trained again
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"vocabulary: {vocab.resolve()} (") and "recorded in" in first


def test_bpe_path_auto_reads_folders_not_shards_or_built_in_data(tmp_path):
    from dalle_lab.training.tokenizer_choice import choose_tokenizers

    with pytest.raises(ValueError, match="for WebDataset shards, python -m dalle_lab.tokenizers.train"):
        choose_tokenizers(TrainConfig(image_text_folder="s-{0..1}.tar", wds="jpg,txt", bpe_path="auto"), vae=object())
    with pytest.raises(ValueError, match="built-in --dataset shapes, leave --bpe_path out"):
        choose_tokenizers(TrainConfig(bpe_path="auto", output_dir=str(tmp_path)), vae=object())


def test_pretokenize_chooses_its_vqgan_as_training_does(tiny_vqgan, tmp_path, capsys):
    from dalle_lab.data.tokens import is_token_dir
    from dalle_lab.training.pretokenize import main

    photos = make_photos(tmp_path / "photos", n=4) and tmp_path / "photos"
    assert main(["--image_text_folder", str(photos), "--out", str(tmp_path / "tokens"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "needs an image tokenizer to be encoded with: python train_vae.py --data" in err and err.count("\n") == 1
    ckpt, yaml = tiny_vqgan
    assert main(["--image_text_folder", str(photos), "--out", str(tmp_path / "tokens"), "--no-progress",
                 "--vqgan_model_path", str(ckpt), "--vqgan_config_path", str(yaml)]) == 0
    assert is_token_dir(tmp_path / "tokens") and "--bpe_path" in capsys.readouterr().out
