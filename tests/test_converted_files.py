"""A converted DALLE-pytorch checkpoint on the user's path: continued with the DALLE-pytorch resume command (its
--bpe_path named again), and moved with its VAE file as a pair."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from dalle_lab.convert import Sources, convert_file

from test_cli import script_main

DATA = Path(__file__).parent / "data" / "dallepytorch"
VOCAB = DATA / "text.model"


def _folder(tmp_path):
    from PIL import Image

    folder = tmp_path / "data"
    folder.mkdir()
    for i in range(2):  # 16 px images, the converted DiscreteVAE's size
        Image.new("RGB", (16, 16), (90 * i, 40, 200)).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text("a red\n")
    return folder


def test_continued_training_takes_the_recorded_vocabulary_named_again_and_reads_it_as_dallepytorch_did(tmp_path):
    converted = convert_file(DATA / "class_defaults.pt", tmp_path / "c.pt", Sources(bpe_path=str(VOCAB)))
    recorded = torch.load(converted, weights_only=True)["tokenizer"]
    code = script_main("train_dalle.py", "--dalle_path", converted, "--bpe_path", VOCAB, "--image_text_folder",
                       _folder(tmp_path), "--max_steps", "1", "--batch_size", "2", "--output_dir", tmp_path / "run",
                       "--no-progress")
    assert code == 0
    trained = torch.load(tmp_path / "run" / "dalle.pt", weights_only=True)["tokenizer"]
    assert trained["kind"] == recorded["kind"] != "yttm" and trained["sha256"] == recorded["sha256"]


def test_a_converted_model_moved_with_its_vae_file_generates(tmp_path):
    converted = convert_file(DATA / "class_defaults.pt", tmp_path / "c.pt", Sources(bpe_path=str(VOCAB)))
    moved = tmp_path / "moved"
    moved.mkdir()
    vae_file = Path(torch.load(converted, weights_only=True)["vae"]["path"])
    for path in (converted, vae_file, tmp_path / Path(VOCAB).name):
        if path.is_file():
            shutil.copy(path, moved / path.name)
    vae_file.unlink()
    args = ["--text", "a red", "--num_images", "1", "--bpe_path", VOCAB]
    assert script_main("generate.py", "--dalle_path", moved / "c.pt", *args, "--outputs_dir", tmp_path / "out") == 0


def test_generate_turns_guidance_off_for_a_model_that_never_saw_dropped_captions_unless_asked(tmp_path, capsys,
                                                                                               tiny_dalle_checkpoint):
    import json

    assert script_main("generate.py", "--dalle_path", tiny_dalle_checkpoint, "--text", "a red circle", "--num_images",
                       "1", "--outputs_dir", tmp_path / "ours") == 0
    assert json.loads((tmp_path / "ours" / "manifest.jsonl").read_text().splitlines()[0])["cond_scale"] == 2.0

    converted = convert_file(DATA / "class_defaults.pt", tmp_path / "c.pt", Sources(bpe_path=str(VOCAB)))
    args = ["--dalle_path", converted, "--text", "a red", "--num_images", "1"]
    assert script_main("generate.py", *args, "--outputs_dir", tmp_path / "off") == 0
    assert "trained without dropped captions (null_cond_prob 0), so classifier-free guidance is off" in \
        capsys.readouterr().err
    assert script_main("generate.py", *args, "--outputs_dir", tmp_path / "on", "--cond_scale", "3") == 0
    assert "guidance is off" not in capsys.readouterr().err
    scales = [json.loads((tmp_path / d / "manifest.jsonl").read_text().splitlines()[0])["cond_scale"]
              for d in ("off", "on")]
    assert scales == [1.0, 3.0]


def test_discrete_vae_save_round_trips_every_constructor_setting(tmp_path):
    """DiscreteVAE.save (DALLE-pytorch's VAE file) keeps normalization and the training settings, not only the
    shapes: a VAE read back encodes and trains as the one saved."""
    import inspect

    from dalle_lab.vae.discrete import DiscreteVAE, load_discrete_vae

    settings = dict(normalization=((0.4, 0.45, 0.5), (0.2, 0.25, 0.3)), temperature=0.7, straight_through=True,
                    reinmax=True, kl_div_loss_weight=0.3, smooth_l1_loss=True)
    vae = DiscreteVAE(image_size=16, num_tokens=20, codebook_dim=8, num_layers=2, hidden_dim=6, **settings)
    back = load_discrete_vae(vae.save(tmp_path / "vae.pt"))
    assert back.hparams() == vae.hparams() and set(vae.hparams()) == set(inspect.signature(DiscreteVAE).parameters)
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(back.get_codebook_indices(images), vae.get_codebook_indices(images))


def test_dallepytorch_attention_is_sdpas_function_and_converted_models_use_it(tmp_path):
    """attention_math "dallepytorch" changes only the order of the sums: the same function as SDPA to float32
    rounding, with a causal mask offset for queries after a prefix, a boolean mask and the stable softmax."""
    import torch.nn.functional as F

    from dalle_lab.model.attention import dallepytorch_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) * 3 for n in (4, 6, 6))
    mask = torch.rand(4, 6, generator=g) > 0.3
    mask[:, 0] = True
    causal = torch.ones(4, 6, dtype=torch.bool).tril(2)  # 4 queries at positions 2..5 of 6 keys
    cases = ((dict(is_causal=True), dict(attn_mask=causal)), (dict(attn_mask=mask), dict(attn_mask=mask)))
    for kwargs, reference in cases:
        expected = F.scaled_dot_product_attention(q, k, v, **reference)
        for stable in (False, True):
            torch.testing.assert_close(dallepytorch_attention(q, k, v, stable=stable, **kwargs), expected,
                                       atol=1e-6, rtol=1e-5)
    converted = convert_file(DATA / "class_defaults.pt", tmp_path / "c.pt", Sources(bpe_path=str(VOCAB)))
    assert torch.load(converted, weights_only=True)["config"]["attention_math"] == "dallepytorch"
