"""Parity report (dalle_lab.precision.aesthetic_parity), its command line (precision/parity.py), and the fine-tuning loop's reward-gap guard."""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from dalle_lab.numerics.reward_gap import reward_gap, reward_gap_warning, score_in_precision
from dalle_lab.precision import aesthetic_parity as parity
from dalle_lab.precision.inputs import load_embedding_folder, load_image_folder
from dalle_lab.precision.parity import main
from dalle_lab.rewards.aesthetic import AestheticHead, AestheticScorer

ASSETS = Path(os.environ.get("DALLE_LAB_AESTHETIC_ASSETS",
                             Path(__file__).resolve().parents[2] / "shared" / "assets" / "aesthetic"))
HEAD = ASSETS / "sac+logos+ava1-l14-linearMSE.pth"
EMBEDDINGS = ASSETS / "vit_l_14_embeddings"
needs_assets = pytest.mark.skipif(not HEAD.is_file(), reason=f"real LAION head not present at {HEAD}")


@pytest.fixture(scope="module")
def tiny_clip_dir(tmp_path_factory):
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    config = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=32, patch_size=8, projection_dim=768, hidden_act="quick_gelu")
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("tiny_clip")
    CLIPVisionModelWithProjection(config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for i, (height, width) in enumerate([(40, 40), (40, 40), (48, 36), (40, 40)]):
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(folder / f"img{i}.png")
    (folder / "notes.txt").write_text("not an image")
    return folder


def test_score_bound_covers_any_affine_head_change():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(64, generator=generator, dtype=torch.float64)
    first = torch.nn.functional.normalize(torch.randn(200, 64, generator=generator, dtype=torch.float64), dim=1)
    second = torch.nn.functional.normalize(first + 0.3 * torch.randn(200, 64, generator=generator,
                                                                     dtype=torch.float64), dim=1)
    cosine = (first * second).sum(1).numpy()
    change = ((first - second) @ weight).abs().numpy()
    bound = parity.score_bound(float(weight.norm()), cosine)
    assert np.all(change <= bound + 1e-9)
    assert bound.max() > 0 and parity.score_bound(1.0, [1.0])[0] == 0.0


@needs_assets
def test_head_only_parity_on_the_real_rating_embeddings():
    embeddings, names = load_embedding_folder(EMBEDDINGS)
    assert names == [f"rating{i}" for i in range(10)]  # natural order, not rating0, rating1, rating10...
    report = parity.head_parity(AestheticHead.from_file(HEAD), embeddings, names=names)
    assert report["fp32_monotone"]
    assert report["fp32_scores"][0] == pytest.approx(1.655, abs=0.01)
    assert report["fp32_scores"][-1] == pytest.approx(5.747, abs=0.01)
    for mode, result in report["modes"].items():
        # the head alone barely moves: the TPU effect lives in the image encoder
        assert result["monotone"] and result["spearman"] == pytest.approx(1.0), mode
        assert 0 < result["score_abs_diff_max"] < 0.05, mode


@needs_assets
def test_encoder_parity_reports_cosines_layers_and_a_bound_that_holds(tiny_clip_dir, image_folder):
    scorer = AestheticScorer(tiny_clip_dir, head_path=HEAD)
    images, names = load_image_folder(image_folder)
    assert names == ["img0.png", "img1.png", "img2.png", "img3.png"]
    report = parity.encoder_parity(scorer, images, names=names, batch_size=2)
    assert len(report["fp32_scores"]) == 4 and report["head_weight_norm"] == pytest.approx(18.0, abs=0.05)
    for mode, result in report["modes"].items():
        summary = result["summary"]
        assert 0.99 < summary["cosine_min"] < 1.0, mode
        assert summary["bound_holds_encoder_share"] == 4, mode
        assert summary["worst_image"] in names
        assert len(result["per_layer"]["cosine_mean"]) == 3  # embeddings + 2 layers
    between = report["between_modes"]
    assert set(between) == {"bf16 vs fp16", "bf16 vs tpu_default", "fp16 vs tpu_default"}
    assert 0.99 < between["bf16 vs tpu_default"]["cosine_min"] < 1.0  # similar, not identical
    # 2 layers x 8 products + patch conv + projection in the encoder, and the head's 5 linears
    assert report["modes"]["tpu_default"]["summary"]["products_rounded_per_batch"] == 8 * 2 + 2 + 5


@needs_assets
def test_parity_command_writes_json_markdown_and_png(tiny_clip_dir, image_folder, tmp_path):
    from PIL import Image

    out = tmp_path / "report"
    report = main(["--clip_path", str(tiny_clip_dir), "--head_path", str(HEAD), "--images", str(image_folder),
                   "--embeddings", str(EMBEDDINGS), "--modes", "bf16", "tpu_default", "--max_images", "3",
                   "--out", str(out)])
    saved = json.loads((out / "parity.json").read_text())
    assert set(saved["encoder"]["modes"]) == {"bf16", "tpu_default"}
    assert saved["encoder"]["images"] == ["img0.png", "img1.png", "img2.png"]
    assert set(saved["head_only"]["modes"]) == {"bf16", "tpu_default"}
    markdown = (out / "parity.md").read_text()
    assert "| tpu_default |" in markdown and "Head only" in markdown and "RANDOM" not in markdown
    with Image.open(out / "parity.png") as plot:
        assert plot.format == "PNG" and plot.size[0] > 300
    assert report["clip"].startswith("CLIP from")


@needs_assets
def test_parity_command_says_plainly_when_clip_weights_are_random(tmp_path):
    from PIL import Image

    folder = tmp_path / "images"
    folder.mkdir()
    Image.fromarray(np.full((24, 24, 3), 128, dtype=np.uint8)).save(folder / "gray.png")
    main(["--head_path", str(HEAD), "--images", str(folder), "--random_clip_layers", "1", "--modes", "tpu_default",
          "--out", str(tmp_path / "out")])
    assert "CLIP WEIGHTS ARE RANDOM" in (tmp_path / "out" / "parity.md").read_text()
    saved = json.loads((tmp_path / "out" / "parity.json").read_text())
    assert "RANDOM" in saved["clip"] and len(saved["encoder"]["modes"]["tpu_default"]["per_layer"]["cosine_mean"]) == 2


@needs_assets
def test_parity_command_refuses_to_run_on_nothing():
    with pytest.raises(SystemExit, match="nothing to compare"):
        main(["--head_path", str(HEAD)])


@needs_assets
def test_reward_gap_scores_a_fraction_in_fp32_and_restores_the_reward(tiny_clip_dir):
    from dalle_lab.rewards import aesthetic_reward

    reward = aesthetic_reward(str(tiny_clip_dir), head_path=str(HEAD), precision="bf16")
    images = torch.rand(8, 3, 32, 32)
    gap = reward_gap(reward, images, ["a prompt"] * 8, "bf16", fraction=0.5, generator=torch.Generator().manual_seed(0))
    assert gap["n"] == 4 and gap["precision"] == "bf16"
    assert float(gap) == gap["mean_abs_diff"] > 0
    assert reward.scorer.precision == "bf16"  # switched to fp32 for the reference scores only
    fp32 = score_in_precision(reward, images, None, "fp32")
    torch.testing.assert_close(fp32, reward.scorer(images, precision="fp32"))

    # scores already computed in the low precision are used as they are
    gap = reward_gap(reward, images, None, "bf16", scores=torch.zeros(8))
    assert gap["n"] == 8 and gap["precision_mean"] == 0.0 and gap["mean_diff"] == pytest.approx(-gap["fp32_mean"])


def test_reward_gap_needs_a_model_to_cast_and_warns_past_thresholds():
    def plain_reward(images, prompts=None):
        return images.mean(dim=(1, 2, 3))

    with pytest.raises(ValueError, match="no torch model to cast"):
        reward_gap(plain_reward, torch.rand(4, 3, 8, 8), None, "bf16")
    gap = reward_gap(plain_reward, torch.rand(4, 3, 8, 8), None, "tpu_default")  # needs no model: no products
    assert gap["mean_abs_diff"] == 0.0 and reward_gap_warning(gap) is None

    agree = {"n": 16, "precision": "tpu_default", "mean_abs_diff": 0.01, "spearman": 0.97}
    assert reward_gap_warning(agree) is None
    shuffled = dict(agree, spearman=0.3)
    assert "rank correlation" in reward_gap_warning(shuffled)
    shifted = dict(agree, mean_abs_diff=0.5)
    assert "0.5000 > 0.1" in reward_gap_warning(shifted)
    assert reward_gap_warning(dict(shuffled, n=4)) is None  # too few images to trust a rank correlation


@needs_assets
def test_parity_command_on_images_sampled_by_a_dalle_checkpoint(tiny_clip_dir, tmp_path):
    from dalle_lab.training.config import TrainConfig
    from dalle_lab.training.loop import train
    from dalle_lab.vae.tiny import make_tiny_vqgan

    vq_ckpt, vq_yaml = make_tiny_vqgan(tmp_path / "vqgan")
    config = TrainConfig(vqgan_model_path=str(vq_ckpt), vqgan_config_path=str(vq_yaml), batch_size=2, max_steps=1,
                         output_dir=str(tmp_path / "run"), sample_every_n_steps=0, progress=False)
    checkpoint = train(config, dict(dim=32, depth=1, heads=2, dim_head=16, null_cond_prob=0.0)).checkpoint_path
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n\na blue square on a white background\n")
    main(["--clip_path", str(tiny_clip_dir), "--head_path", str(HEAD), "--dalle_path", str(checkpoint),
          "--prompts", str(prompts), "--modes", "tpu_default", "--out", str(tmp_path / "out")])
    saved = json.loads((tmp_path / "out" / "parity.json").read_text())
    assert saved["encoder"]["images"] == ["a red circle", "a blue square on a white background"]
    assert saved["images_source"].startswith("sampled by")


def test_parity_command_names_a_missing_file(tmp_path):
    with pytest.raises(SystemExit, match="missing.pth"):
        main(["--head_path", str(tmp_path / "missing.pth"), "--embeddings", str(tmp_path)])


def test_parity_command_names_embeddings_of_another_width_and_a_zero_image_count(tmp_path):
    if not HEAD.is_file():
        pytest.skip(f"the LAION head is not at {HEAD}")
    np.save(tmp_path / "a.npy", np.ones(512, dtype=np.float32))  # a ViT-B/32 embedding: 512, not 768
    with pytest.raises(SystemExit, match=r"512-dimensional but the head .* expects 768"):
        main(["--head_path", str(HEAD), "--embeddings", str(tmp_path)])
    with pytest.raises(SystemExit, match="--max_images must be at least 1, got 0"):
        main(["--head_path", str(HEAD), "--embeddings", str(tmp_path), "--max_images", "0"])
