"""Pre-tokenized data: pretokenize writes token shards once; training reads them without running the VQGAN encoder,
step for step like training on the folder itself, and resumes exactly."""
import json
import logging

import numpy as np
import pytest
import torch

from dalle_lab.data.pretokenize import pretokenize, summary
from dalle_lab.data.tokens import TokenShards, is_token_dir
from dalle_lab.training.loop import train
from dalle_lab.vae import VQGanVAE

from test_training import tiny_config
from test_training_resume import RANDOM_MODEL, assert_same_weights, final_weights, split_run, two_caption_folder


@pytest.fixture
def folder(tmp_path):
    return two_caption_folder(tmp_path / "data", n=6)


@pytest.fixture
def tokens(tiny_vqgan, folder, tmp_path):
    return pretokenize(str(folder), tmp_path / "tokens", VQGanVAE(*tiny_vqgan), shard_size=4, batch_size=3,
                       progress=False) and tmp_path / "tokens"


def token_config(tokens_dir, output_dir, **overrides):
    """Training on token shards: no VQGAN flags, the recorded one is loaded (it still decodes sample grids)."""
    return tiny_config((None, None), output_dir, image_text_folder=str(tokens_dir), vqgan_model_path=None,
                       vqgan_config_path=None, **overrides)


def test_token_shards_hold_every_caption_and_the_codes_the_vqgan_gives(tiny_vqgan, folder, tokens):
    from dalle_lab.data import TextImageFolder

    index = json.loads((tokens / "index.json").read_text())
    assert is_token_dir(tokens) and not is_token_dir(folder)
    assert index["complete"] and index["items"] == 6 and [s["items"] for s in index["shards"]] == [4, 2]
    assert index["dtype"] == "int16" and index["fmap_size"] == 8 and index["num_tokens"] == 64
    assert index["vae"] == VQGanVAE(*tiny_vqgan).identity
    data, images = TokenShards(tokens), TextImageFolder(folder, image_size=32)
    assert data.keys == images.keys
    vae = VQGanVAE(*tiny_vqgan)
    for i in range(6):
        assert data.captions(i) == images.captions(i) and len(data.captions(i)) == 2
        assert torch.equal(data.tokens(i), vae.get_codebook_indices(images.load(i)[None])[0])


@pytest.mark.parametrize("null_cond_prob", [0.0, 0.5])
def test_training_on_token_shards_matches_training_on_the_folder_step_for_step(tiny_vqgan, folder, tokens, tmp_path,
                                                                              monkeypatch, null_cond_prob):
    model = {**RANDOM_MODEL, "null_cond_prob": null_cond_prob}
    settings = dict(batch_size=2, max_steps=5, amp=False)  # 3 batches an epoch: two epochs, two caption draws
    on_folder = train(tiny_config(tiny_vqgan, tmp_path / "folder", image_text_folder=str(folder), **settings), model)

    def no_encoding(self, images):
        raise AssertionError("the VQGAN encoder ran while training on token shards")

    monkeypatch.setattr(VQGanVAE, "get_codebook_indices", no_encoding)
    on_tokens = train(token_config(tokens, tmp_path / "tokens_run", **settings), model)
    assert [h["loss"] for h in on_tokens.history] == [h["loss"] for h in on_folder.history]
    assert_same_weights(final_weights(on_folder), final_weights(on_tokens), atol=0)
    saved = torch.load(on_tokens.checkpoint_path, weights_only=True)
    assert saved["vae"]["sha256"] == VQGanVAE(*tiny_vqgan).identity["sha256"]
    assert saved["data_position"] == {"kind": "tokens", "epoch": 1, "batch": 2}


def test_resume_is_exact_on_token_shards_with_workers_and_caption_dropout(tiny_vqgan, folder, tmp_path):
    for caption_file in folder.glob("*.txt"):  # three lines: a caption draw that depends on a worker shows
        caption_file.write_text(caption_file.read_text() + "a third caption\n")
    tokens = tmp_path / "tokens"
    pretokenize(str(folder), tokens, VQGanVAE(*tiny_vqgan), shard_size=4, progress=False)

    def cfg(out, **kw):
        return token_config(tokens, out, batch_size=2, max_steps=None, epochs=2, num_workers=2, amp=False, **kw)

    straight = train(cfg(tmp_path / "straight"), RANDOM_MODEL)
    resumed = split_run(lambda **kw: cfg(tmp_path / "split", **kw), stop_at=4)  # epoch 1, batch 1 of 3
    assert straight.step == resumed.step == 6
    assert [h["loss"] for h in resumed.history] == pytest.approx([h["loss"] for h in straight.history[4:]], abs=1e-6)
    assert_same_weights(final_weights(straight), final_weights(resumed))


def test_ranks_take_disjoint_items_of_the_same_epoch_order(tokens):
    from dalle_lab.training.batches import FolderBatches

    def captions(rank, world_size, batch_size):
        source = FolderBatches(TokenShards(tokens), batch_size, seed=1, rank=rank, world_size=world_size,
                               kind="tokens")
        return [c for _ in range(2) for c in source.next_batch()[0]]

    one = captions(0, 1, 2)  # one process, batch 2: the first 4 items of epoch 0 in order
    ranks = [captions(r, 2, 1) for r in (0, 1)]
    assert [ranks[j % 2][j // 2] for j in range(4)] == one  # rank r takes positions r, r + 2, ...


def test_corrupt_images_and_missing_captions_are_named_counted_and_skipped(tiny_vqgan, folder, tmp_path, caplog):
    (folder / "broken.png").write_bytes(b"not a png")
    (folder / "broken.txt").write_text("a broken image\n")
    (folder / "lonely.png").write_bytes((folder / "0.png").read_bytes())
    with caplog.at_level(logging.WARNING):
        index = pretokenize(str(folder), tmp_path / "tokens", VQGanVAE(*tiny_vqgan), shard_size=4, progress=False,
                            num_workers=2)  # found by a worker: reported by the main process all the same
    assert index["items"] == 6 and index["complete"]
    assert "(broken.png)" in caplog.text and "lonely.png" in caplog.text  # broken.png: found by its header
    text = summary(index)
    assert "6 images tokenized" in text and "2 skipped" in text and "broken.png: corrupt image" in text
    assert "lonely.png: no caption file" in text
    assert "broken.png" not in TokenShards(tmp_path / "tokens").keys


def test_bad_shard_samples_are_named_and_counted(tiny_vqgan, tmp_path):
    import io

    import webdataset as wds
    from PIL import Image

    def png(color):
        buffer = io.BytesIO()
        Image.new("RGB", (40, 40), color).save(buffer, "png")
        return buffer.getvalue()

    for k in range(2):
        with wds.TarWriter(str(tmp_path / f"s{k}.tar")) as sink:
            sink.write({"__key__": f"good{k}", "png": png((9, 9, 9)), "txt": b"first\nsecond"})
            sink.write({"__key__": f"corrupt{k}", "jpg": b"not a jpeg", "txt": b"broken"})
            sink.write({"__key__": f"nocaption{k}", "png": png((1, 2, 3))})
    index = pretokenize(str(tmp_path / "s{0..1}.tar"), tmp_path / "tokens", VQGanVAE(*tiny_vqgan), wds=True,
                        progress=False)
    assert index["items"] == 2 and len(index["shards"]) == 2  # one output shard per input shard
    reasons = {s["item"].rsplit(":", 1)[1]: s["reason"] for e in index["shards"] for s in e["skipped"]}
    assert set(reasons) == {"corrupt0", "corrupt1", "nocaption0", "nocaption1"}
    assert reasons["corrupt0"].startswith("corrupt image")
    assert TokenShards(tmp_path / "tokens").captions(1) == ["first", "second"]


def test_a_killed_pretokenize_continues_where_it_stopped(tiny_vqgan, folder, tmp_path, monkeypatch):
    from dalle_lab.data import pretokenize as module

    vae = VQGanVAE(*tiny_vqgan)
    straight = pretokenize(str(folder), tmp_path / "straight", vae, shard_size=2, progress=False)
    real_write, written = module._write_shard, []

    def dies_after_two(out, number, *args):
        if len(written) == 2:
            raise KeyboardInterrupt  # killed while encoding the third shard
        written.append(number)
        return real_write(out, number, *args)

    monkeypatch.setattr(module, "_write_shard", dies_after_two)
    with pytest.raises(KeyboardInterrupt):
        pretokenize(str(folder), tmp_path / "split", vae, shard_size=2, progress=False)
    partial = json.loads((tmp_path / "split" / "index.json").read_text())
    assert not partial["complete"] and len(partial["shards"]) == 2
    with pytest.raises(ValueError, match="unfinished"):
        TokenShards(tmp_path / "split")
    monkeypatch.setattr(module, "_write_shard", real_write)
    encoded, original = [], VQGanVAE.get_codebook_indices

    def counting(self, images):
        encoded.append(len(images))
        return original(self, images)

    monkeypatch.setattr(VQGanVAE, "get_codebook_indices", counting)
    resumed = pretokenize(str(folder), tmp_path / "split", vae, shard_size=2, progress=False)
    assert sum(encoded) == 2  # only the unfinished third shard's two images were encoded
    assert resumed["complete"] and resumed["items"] == straight["items"] == 6
    for number in range(3):
        name = f"tokens-{number:05d}.npy"
        assert np.array_equal(np.load(tmp_path / "split" / name), np.load(tmp_path / "straight" / name))
    with pytest.raises(ValueError, match="already holds tokens of"):
        pretokenize(str(folder), tmp_path / "split", vae, shard_size=3, progress=False)


def test_another_vqgan_than_the_shards_were_made_with_is_one_line_naming_both(tokens, tiny_vqgan, tmp_path, capsys):
    from dalle_lab.vae.tiny import make_tiny_vqgan

    other = make_tiny_vqgan(tmp_path / "other", seed=1)
    with pytest.raises(ValueError) as error:
        train(tiny_config(other, tmp_path / "run", image_text_folder=str(tokens), max_steps=1))
    message = str(error.value)
    assert "\n" not in message and str(other[0]) in message and str(tiny_vqgan[0].resolve()) in message

    from test_cli import script_main

    from dalle_lab.tokenizers import DEFAULT_BPE_PATH

    assert script_main("train_dalle.py", "--image_text_folder", tokens, "--bpe_path", DEFAULT_BPE_PATH,
                       "--vqgan_model_path", other[0],
                       "--vqgan_config_path", other[1], "--output_dir", tmp_path / "cli", "--max_steps", "1") == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "was tokenized with the VQGAN" in err
