"""The project's own CLIP: tokenising, the CLIPScore formula, gradients to the pixels, loading and its errors,
training (reproducible, duplicate captions masked), the attribute variants, and the shipped model."""
import json
import shutil

import numpy as np
import pytest
import torch

from dalle_lab.data.shapes import ShapesDataset, describe, parse, split_of
from dalle_lab.rewards.clip import (CLIPSCORE_WEIGHT, SHIPPED_CLIP_DIR, ClipArchitecture, ClipScorer, caption_ids,
                                    load_clip, new_clip, save_clip)
from dalle_lab.rewards.clip_data import _attribute_value, attributes_of, hard_negative, variants
from dalle_lab.rewards.clip_train import ClipTrainConfig, contrastive_loss, main, train_clip
from dalle_lab.tokenizers.base import EOS_ID, PAD_ID
from dalle_lab.tokenizers.loading import get_tokenizer

TINY = ClipArchitecture(patch_size=8, vision_width=16, vision_layers=1, vision_heads=2, text_width=16, text_layers=1,
                        text_heads=2, mlp_ratio=2, embed_dim=8)
CAPTIONS = ["a small red circle at the top left on a white background",
            "a green square above a blue triangle on a black background"]


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer):
    directory = tmp_path_factory.mktemp("clip") / "tiny"
    return save_clip(new_clip(TINY, tokenizer.vocab_size, seed=0), tokenizer, TINY, directory)


def shapes_images(n, split="val"):
    return ShapesDataset(split, n).batch(range(n))


def test_caption_ids_append_end_of_text_and_pad(tokenizer):
    ids, mask = caption_ids(tokenizer, [CAPTIONS[1], "a"], 16)
    assert len(tokenizer.encode(CAPTIONS[1])) == 11  # one token per word of the grammar
    assert ids.shape == mask.shape == (2, 12)  # padded to the longest caption of the batch (11 words + end-of-text)
    assert ids[0, 11] == EOS_ID and mask[0].sum() == 12
    assert ids[1, 1] == EOS_ID and (ids[1, 2:] == PAD_ID).all() and mask[1].tolist() == [1, 1] + [0] * 10
    with pytest.raises(ValueError, match="reads at most 4"):
        caption_ids(tokenizer, [CAPTIONS[0]], 5)


def test_text_embedding_does_not_depend_on_padding(tiny_dir):
    scorer = ClipScorer(tiny_dir)
    alone = scorer.encode_text(["a"])  # no padding
    scorer._text_cache.clear()
    padded = scorer.encode_text(["a", CAPTIONS[0]])[:1]  # padded to 13 positions beside the longest caption
    torch.testing.assert_close(alone, padded, atol=1e-6, rtol=0)


def test_clip_score_is_clipscore_of_transformers_own_embeddings(tiny_dir, tokenizer):
    from transformers import CLIPModel

    from dalle_lab.rewards.preprocess import clip_preprocess

    images, captions = shapes_images(4)
    scores = ClipScorer(tiny_dir)(images, captions)
    model = CLIPModel.from_pretrained(tiny_dir).eval()  # an independent path: transformers' own feature API
    ids, mask = caption_ids(tokenizer, captions, TINY.context_length)
    with torch.no_grad():
        image = model.get_image_features(pixel_values=clip_preprocess(images, 32))
        text = model.get_text_features(input_ids=ids, attention_mask=mask)
    image = getattr(image, "pooler_output", image)  # transformers 5 returns an output object
    text = getattr(text, "pooler_output", text)
    cosine = torch.nn.functional.cosine_similarity(image, text, dim=-1)
    expected = CLIPSCORE_WEIGHT * torch.where(cosine > 0, cosine, torch.zeros_like(cosine))
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=0)
    assert (cosine < 0).any() or (scores > 0).all()


def test_clip_score_gradient_reaches_the_pixels(tiny_dir):
    images, captions = shapes_images(3)
    images = images.clone().requires_grad_(True)
    scorer = ClipScorer(tiny_dir)
    cosine = scorer.cosine(images, captions)
    scorer(images, captions).sum().backward()
    for grad, value in zip(images.grad, cosine):
        assert torch.isfinite(grad).all()
        # CLIPScore's max(cos, 0): a caption the image does not match at all gives no gradient
        assert (grad.abs().sum() > 0) == (value > 0)
    assert all(not p.requires_grad for p in scorer.parameters())


def test_missing_and_bad_checkpoints_are_named(tmp_path, tiny_dir):
    with pytest.raises(FileNotFoundError, match=r"CLIP model .*nowhere not found.*clip_train --out"):
        ClipScorer(tmp_path / "nowhere")
    vision_only = tmp_path / "vision_only"
    vision_only.mkdir()
    (vision_only / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="has no dalle_lab_clip.json"):
        ClipScorer(vision_only)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=r"cannot load the CLIP weights in .*broken"):
        ClipScorer(broken)
    other_vocab = tmp_path / "other_vocab"
    shutil.copytree(tiny_dir, other_vocab)
    shutil.copyfile(get_tokenizer(dataset="emoji").path, other_vocab / "text_vocab.model")
    with pytest.raises(ValueError, match="is not the vocabulary this CLIP was trained with"):
        ClipScorer(other_vocab)


def test_image_tower_loads_through_the_real_clip_path(tiny_dir):
    from dalle_lab.rewards.aesthetic import load_clip_vision

    images, _ = shapes_images(2)
    vision = load_clip_vision(tiny_dir)
    scorer = ClipScorer(tiny_dir)
    with torch.no_grad():
        embeds = vision(pixel_values=scorer.preprocess(images)).image_embeds
    torch.testing.assert_close(embeds / embeds.norm(dim=-1, keepdim=True), scorer.encode_images(images)[1])


def test_registry_builds_a_differentiable_clip_score(tiny_dir):
    from dalle_lab.rewards import get_reward, is_differentiable

    reward = get_reward("clip_score", clip_score_path=str(tiny_dir), clip_path=None, head_path=None)
    combined = get_reward("clip_score:2+brightness:1", clip_score_path=str(tiny_dir))
    images, captions = shapes_images(2)
    assert is_differentiable(reward) and is_differentiable(combined)
    torch.testing.assert_close(combined(images, captions), 2 * reward(images, captions) + images.mean(dim=(1, 2, 3)))
    with pytest.raises(ValueError, match="one caption per image"):
        reward(images, captions[:1])


def test_low_precisions_run_and_restore_the_weights(tiny_dir):
    scorer = ClipScorer(tiny_dir)
    images, captions = shapes_images(2)
    before = {k: v.clone() for k, v in scorer.model.state_dict().items()}
    reference = scorer.cosine(images, captions)
    for mode in ("bf16", "tpu_default"):
        value = scorer.cosine(images, captions, precision=mode)
        assert (value - reference).abs().max() < 0.05
    assert scorer.last_precision.num_products > 0
    assert all(torch.equal(before[k], v) for k, v in scorer.model.state_dict().items())


def test_contrastive_loss_does_not_count_a_repeated_caption_as_negative():
    torch.manual_seed(0)
    image = torch.nn.functional.normalize(torch.randn(3, 4), dim=-1)
    text = torch.nn.functional.normalize(torch.randn(3, 4), dim=-1)
    captions = ["a", "a", "b"]
    loss = contrastive_loss(image, text, None, 10.0, captions)
    logits = 10.0 * image @ text.T
    logits[0, 1] = logits[1, 0] = float("-inf")
    targets = torch.arange(3)
    expected = (torch.nn.functional.cross_entropy(logits, targets) + torch.nn.functional.cross_entropy(logits.T, targets)) / 2
    torch.testing.assert_close(loss, expected)


def test_variants_change_one_attribute_and_negatives_are_training_captions():
    one = parse("a small red circle at the top left on a white background")
    two = parse("a green square above a blue triangle on a black background")
    assert {a: len(variants(one, a)) for a in attributes_of(one)} == \
        {"color": 5, "shape": 2, "size": 1, "place": 8, "background": 2}
    assert {a: len(variants(two, a)) for a in attributes_of(two)} == \
        {"color": 8, "shape": 4, "relation": 3, "background": 2}
    for spec in (one, two):
        for attribute in attributes_of(spec):
            for variant in variants(spec, attribute):
                changed = {a for a in attributes_of(spec) if _attribute_value(variant, a) != _attribute_value(spec, a)}
                assert changed == {attribute}
    rng = np.random.default_rng(0)
    negatives = [hard_negative(two, rng) for _ in range(20)]
    assert all(split_of(n) == "train" and n != describe(two) for n in negatives)
    with pytest.raises(ValueError, match="has no attribute 'relation'"):
        variants(one, "relation")


def test_training_is_seeded_and_the_cli_writes_a_loadable_directory(tmp_path):
    config = ClipTrainConfig(arch=TINY, steps=3, batch_size=8, warmup_steps=1, eval_pairs=10)
    first, _ = train_clip(config, log=lambda line: None)
    second, _ = train_clip(config, log=lambda line: None)
    assert all(torch.equal(a, b) for a, b in zip(first.model.state_dict().values(), second.model.state_dict().values()))
    flags = [f"--{k}={v}" for k, v in vars(TINY).items()]
    out = tmp_path / "cli"
    main(["--out", str(out), "--steps", "3", "--batch_size", "8", "--warmup_steps", "1", "--eval_pairs", "10",
          "--results", str(tmp_path / "results.json"), *flags])
    metadata = json.loads((out / "dalle_lab_clip.json").read_text())
    assert set(metadata["training"]["evaluation"]) == {"val", "heldout"}
    assert 0 <= metadata["training"]["evaluation"]["val"]["caption_to_image_top1"] <= 1
    model, _, meta = load_clip(out)
    assert meta["architecture"] == TINY
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), first.model.state_dict().values()))
    assert json.loads((tmp_path / "results.json").read_text())["config"]["steps"] == 3
    with pytest.raises(SystemExit):
        main(["--out", str(out), "--batch_size", "1"])
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="is not a dalle_lab CLIP directory"):
        save_clip(first.model, first.tokenizer, TINY, precious)
    with pytest.raises(SystemExit, match="is not a dalle_lab CLIP directory"):
        main(["--out", str(precious), "--steps", "1", "--batch_size", "2"])
    assert (precious / "notes.txt").read_text() == "keep me"


@pytest.mark.skipif(not (SHIPPED_CLIP_DIR / "dalle_lab_clip.json").is_file(), reason="shipped Shapes CLIP not built")
def test_shipped_clip_scores_a_matching_caption_above_a_shuffled_one():
    from dalle_lab.rewards import get_reward

    reward = get_reward("clip_score")
    images, captions = shapes_images(32)
    matched = reward(images, captions)
    shuffled = reward(images, captions[1:] + captions[:1])
    assert matched.mean() > shuffled.mean() + 0.2
    assert (matched > shuffled).float().mean() > 0.8


def test_clip_parity_report_matches_the_scorer_in_each_mode(tiny_dir, tmp_path):
    from dalle_lab.precision.clip_parity import clip_parity, main as parity_main

    scorer = ClipScorer(tiny_dir)
    images, captions = shapes_images(6)
    report = clip_parity(scorer, images, captions, modes=["bf16", "tpu_default"], batch_size=4)
    torch.testing.assert_close(torch.tensor(report["fp32_scores"]).float(), scorer(images, captions))
    bf16 = scorer(images, captions, precision="bf16")
    torch.testing.assert_close(torch.tensor(report["modes"]["bf16"]["per_image"]["score"]).float(), bf16)
    assert len(report["modes"]["tpu_default"]["per_layer_cosine_mean"]) == TINY.vision_layers + 1
    assert 0.9 < report["modes"]["tpu_default"]["image_cosine_min"] <= 1 + 1e-9
    parity_main(["--clip_path", str(tiny_dir), "--n", "8", "--modes", "bf16", "--out", str(tmp_path / "p")])
    assert {p.name for p in (tmp_path / "p").iterdir()} == {"parity.json", "parity.md", "parity.png"}
