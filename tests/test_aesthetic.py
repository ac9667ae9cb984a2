"""The LAION aesthetic scorer: the real head on real embeddings, tiny CLIPs through every local loading path."""
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dalle_lab.rewards.aesthetic import (AestheticHead, AestheticScorer, clip_vision_from_openai_state_dict,
                                       load_clip_vision)
from dalle_lab.rewards.preprocess import clip_preprocess

# the shared copy of the real LAION head and rating embeddings (override with $DALLE_LAB_AESTHETIC_ASSETS)
ASSETS = Path(os.environ.get("DALLE_LAB_AESTHETIC_ASSETS",
                             Path(__file__).resolve().parents[2] / "shared" / "assets" / "aesthetic"))
HEAD = ASSETS / "sac+logos+ava1-l14-linearMSE.pth"
needs_assets = pytest.mark.skipif(not HEAD.is_file(), reason=f"real LAION head not present at {HEAD}")


def rating_embeddings() -> torch.Tensor:
    return torch.cat([torch.from_numpy(np.load(ASSETS / "vit_l_14_embeddings" / f"rating{i}.npy")) for i in range(10)])


def tiny_vision_config(**overrides):
    from transformers import CLIPVisionConfig

    fields = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                  patch_size=8, projection_dim=768, hidden_act="quick_gelu")
    fields.update(overrides)
    return CLIPVisionConfig(**fields)


@pytest.fixture(scope="module")
def tiny_clip_dir(tmp_path_factory):
    from transformers import CLIPVisionModelWithProjection

    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("tiny_clip")
    CLIPVisionModelWithProjection(tiny_vision_config()).save_pretrained(directory)
    return directory


@needs_assets
def test_real_head_scores_real_rating_embeddings_in_increasing_order():
    head = AestheticHead.from_file(HEAD)
    with torch.no_grad():
        scores = head(rating_embeddings())
    assert scores.shape == (10,)
    assert torch.all(scores[1:] > scores[:-1])
    assert abs(scores[0].item() - 1.66) < 0.01 and abs(scores[-1].item() - 5.75) < 0.01
    weight, bias = head.linear_equivalent()
    assert abs(weight.norm().item() - 18.0) < 0.05 and abs(bias.item() - 5.24) < 0.01
    np.testing.assert_allclose((rating_embeddings().double() @ weight + bias).numpy(), scores.numpy(), atol=1e-4)


def test_head_file_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.pth"):
        AestheticHead.from_file(tmp_path / "missing.pth")
    wrong = tmp_path / "wrong.pth"
    torch.save({"fc.weight": torch.zeros(1, 768)}, wrong)
    with pytest.raises(ValueError, match="wrong.pth"):
        AestheticHead.from_file(wrong)
    linear = tmp_path / "linear.pth"
    torch.save({"weight": torch.ones(1, 768), "bias": torch.tensor([2.0])}, linear)
    head = AestheticHead.from_file(linear)
    assert head(torch.full((1, 768), 0.5)).item() == pytest.approx(386.0)


@needs_assets
def test_scorer_from_local_transformers_dir_equals_manual_pipeline(tiny_clip_dir):
    scorer = AestheticScorer(tiny_clip_dir, head_path=HEAD)
    images = torch.rand(3, 3, 40, 56, requires_grad=True)
    scores = scorer(images)
    assert scores.shape == (3,) and scores.dtype == torch.float32

    vision = load_clip_vision(tiny_clip_dir)
    embeds = vision(pixel_values=clip_preprocess(images, image_size=32)).image_embeds
    head = AestheticHead.from_file(HEAD)
    manual = head(embeds / embeds.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(scores, manual)
    assert torch.allclose(scorer.embed(images).norm(dim=-1), torch.ones(3))

    scores.sum().backward()  # the reward-backprop path needs gradients through preprocessing and the encoder
    assert images.grad is not None and images.grad.abs().sum() > 0
    assert all(not p.requires_grad for p in scorer.parameters())


@needs_assets
def test_scorer_precision_modes_move_scores_and_leave_the_model_intact(tiny_clip_dir):
    scorer = AestheticScorer(tiny_clip_dir, head_path=HEAD)
    images = torch.rand(2, 3, 32, 32)
    before = {k: v.clone() for k, v in scorer.state_dict().items()}
    with torch.no_grad():
        fp32 = scorer(images)
        for mode in ("bf16", "fp16", "tpu_default"):
            moved = scorer(images, precision=mode)
            assert moved.dtype == torch.float32 and not torch.equal(moved, fp32), mode
            assert (moved - fp32).abs().max() < 0.5, mode
        scorer(images, precision="tpu_default")
        # 2 layers x 8 products + patch conv + projection in the encoder, and 5 linears in the head
        assert scorer.last_precision.num_products == 8 * 2 + 2 + 5
    assert all(torch.equal(v, scorer.state_dict()[k]) for k, v in before.items())


@needs_assets
def test_scorer_loads_a_full_clipmodel_directory(tmp_path):
    from transformers import CLIPConfig, CLIPModel

    config = CLIPConfig(text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, vocab_size=100, max_position_embeddings=16),
                        vision_config=tiny_vision_config().to_dict(), projection_dim=768)
    torch.manual_seed(1)
    model = CLIPModel(config).eval()
    model.save_pretrained(tmp_path)
    scorer = AestheticScorer(tmp_path, head_path=HEAD)
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        expected = model.get_image_features(pixel_values=clip_preprocess(images, image_size=32))
        expected = getattr(expected, "pooler_output", expected)
        torch.testing.assert_close(scorer.embed(images), F.normalize(expected, dim=-1))


def test_vision_tower_without_projection_is_refused(tmp_path):
    from transformers import CLIPVisionModel

    CLIPVisionModel(tiny_vision_config()).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="visual_projection"):
        load_clip_vision(tmp_path)


def test_missing_head_is_a_clear_error(tiny_clip_dir, monkeypatch):
    monkeypatch.delenv("DALLE_LAB_AESTHETIC_HEAD", raising=False)
    with pytest.raises(ValueError, match="head_path"):
        AestheticScorer(tiny_clip_dir)


def test_preprocessing_matches_clip_image_processor_on_a_smooth_image():
    from PIL import Image
    from transformers import CLIPImageProcessor

    yy, xx = np.mgrid[0:90, 0:120]
    array = np.stack([np.sin(xx / 9.0), np.cos(yy / 7.0), np.sin((xx + yy) / 13.0)], -1) * 0.5 + 0.5
    array = (array * 255).round().astype(np.uint8)
    processor = CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224})
    reference = processor(images=Image.fromarray(array), return_tensors="pt")["pixel_values"]
    ours = clip_preprocess(torch.from_numpy(array).permute(2, 0, 1)[None].float() / 255.0)
    assert ours.shape == reference.shape == (1, 3, 224, 224)
    difference = (ours - reference).abs() * 0.27  # back to [0,1] pixel units (std is about 0.27)
    assert difference.mean() < 1.0 / 255 and difference.max() < 6.0 / 255  # PIL rounds to 8 bits between passes


class OpenAIResidualBlock(nn.Module):
    """OpenAI CLIP's ResidualAttentionBlock, written here independently of the converter."""

    def __init__(self, width, heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(width, heads)
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.mlp = nn.Sequential()
        self.mlp.add_module("c_fc", nn.Linear(width, 4 * width))
        self.mlp.add_module("c_proj", nn.Linear(4 * width, width))

    def forward(self, x):
        y = self.ln_1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        hidden = self.mlp.c_fc(self.ln_2(x))
        return x + self.mlp.c_proj(hidden * torch.sigmoid(1.702 * hidden))


class OpenAIVisionTransformer(nn.Module):
    def __init__(self, image_size=32, patch=8, width=64, layers=2, output_dim=768):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, patch, stride=patch, bias=False)
        self.class_embedding = nn.Parameter(torch.randn(width) * 0.1)
        self.positional_embedding = nn.Parameter(torch.randn((image_size // patch) ** 2 + 1, width) * 0.1)
        self.ln_pre, self.ln_post = nn.LayerNorm(width), nn.LayerNorm(width)
        self.transformer = nn.Module()
        self.transformer.resblocks = nn.Sequential(*[OpenAIResidualBlock(width, width // 64) for _ in range(layers)])
        self.proj = nn.Parameter(torch.randn(width, output_dim) * width ** -0.5)

    def forward(self, x):
        x = self.conv1(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], dim=1) + self.positional_embedding
        x = self.transformer.resblocks(self.ln_pre(x).transpose(0, 1)).transpose(0, 1)  # sequence-first, as OpenAI
        return self.ln_post(x[:, 0]) @ self.proj


def test_openai_clip_state_dict_converts_to_the_same_encoder(tmp_path):
    torch.manual_seed(2)
    openai = OpenAIVisionTransformer().eval()
    path = tmp_path / "ViT-tiny.pt"
    torch.save({f"visual.{k}": v for k, v in openai.state_dict().items()} | {"logit_scale": torch.tensor(1.0)}, path)
    converted = load_clip_vision(path)
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(converted(pixel_values=pixels).image_embeds, openai(pixels), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="OpenAI CLIP ViT"):
        clip_vision_from_openai_state_dict({"conv1.weight": torch.zeros(1)})


def test_openai_torchscript_archive_loads_too(tmp_path):
    """OpenAI's released ViT-L-14.pt files are TorchScript archives of the whole CLIP (visual.* inside)."""
    import warnings

    class OpenAICLIP(nn.Module):
        def __init__(self):
            super().__init__()
            self.visual = OpenAIVisionTransformer()
            self.logit_scale = nn.Parameter(torch.tensor(4.6))

        def forward(self, pixels):
            return self.visual(pixels)

    torch.manual_seed(3)
    model = OpenAICLIP().eval()
    pixels = torch.randn(1, 3, 32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.trace is deprecated, but it is how those archives were made
        torch.jit.save(torch.jit.trace(model, pixels), tmp_path / "ViT-tiny-jit.pt")
        converted = load_clip_vision(tmp_path / "ViT-tiny-jit.pt")
    with torch.no_grad():
        torch.testing.assert_close(converted(pixel_values=pixels).image_embeds, model(pixels), atol=1e-4, rtol=1e-4)
