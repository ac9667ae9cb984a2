"""The LAION improved aesthetic predictor: CLIP ViT-L/14 image embedding -> L2 normalise -> LAION head -> score.

Everything loads from local files (nothing is downloaded):
- the head from its published `.pth` state dict (`layers.0 ... layers.7`, the "sac+logos+ava1-l14-linearMSE" MLP, which
  has no activations, so it is one affine map `score = w . e + b`), or a single `Linear(768, 1)` state dict;
- the CLIP image encoder from a HuggingFace transformers directory (a CLIPModel or CLIPVisionModelWithProjection saved
  with save_pretrained) or from an OpenAI CLIP state dict file (`visual.*` keys; a TorchScript archive works too),
  converted to transformers' CLIPVisionModelWithProjection.

Preprocessing is CLIP's (shortest side to 224 bicubic, centre crop, CLIP mean/std) written with torch ops
(preprocess.py), so it runs on batches of tensors on any device and stays differentiable for reward backpropagation.

    scorer = AestheticScorer("path/to/clip-vit-large-patch14", head_path="sac+logos+ava1-l14-linearMSE.pth")
    scores = scorer(images)            # images (B,3,H,W) float in [0,1] -> float32 (B,)
    embeds = scorer.embed(images)      # (B,768) unit-norm CLIP embeddings
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from dalle_lab.extras import needs_extra
from dalle_lab.numerics.modes import check_mode, precision_mode
from dalle_lab.rewards.preprocess import CLIP_MEAN, CLIP_STD, clip_preprocess, preprocessor_settings

HEAD_PATH_ENV = "DALLE_LAB_AESTHETIC_HEAD"  # where AestheticScorer looks for the head when head_path is not given


# --------------------------------------------------------------------------------------------------------- the head

class AestheticHead(nn.Module):
    """The improved aesthetic predictor's MLP (layer names match the published state dict).

    The published model lists Dropout layers between the Linear layers and no activation functions, so in eval mode it
    is a single affine map of the embedding; `linear_equivalent()` returns that map.
    """

    def __init__(self, input_size: int = 768):
        super().__init__()
        self.input_size = input_size
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024), nn.Dropout(0.2),
            nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, embeddings):
        return self.layers(embeddings).squeeze(-1)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "AestheticHead":
        """Load the published `.pth` (an MLP `layers.*` state dict, or a bare `Linear(768, 1)` `weight`/`bias`)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"aesthetic head {path} not found: give the path of the LAION predictor .pth "
                                    f"(e.g. sac+logos+ava1-l14-linearMSE.pth)")
        state = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "state_dict" in state:
            state = state["state_dict"]
        if set(state) == {"weight", "bias"}:  # the older single-layer LAION predictor (e.g. sa_0_4_vit_l_14_linear.pth)
            return LinearAestheticHead(state["weight"], state["bias"])
        if "layers.0.weight" not in state:
            raise ValueError(f"{path} is not a LAION aesthetic head: expected keys layers.0.weight ... layers.7.bias "
                             f"or weight/bias, found {sorted(state)[:6]}")
        head = cls(input_size=state["layers.0.weight"].shape[1])
        head.load_state_dict(state, strict=True)
        return head.eval()

    def linear_equivalent(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(w (D,), b ()) with head(e) == w . e + b in eval mode, composed in float64."""
        weight = torch.eye(self.input_size, dtype=torch.float64)
        bias = torch.zeros(self.input_size, dtype=torch.float64)
        for layer in self.layers:
            if isinstance(layer, nn.Linear):
                weight = layer.weight.detach().double().cpu() @ weight
                bias = layer.weight.detach().double().cpu() @ bias + layer.bias.detach().double().cpu()
            elif not isinstance(layer, nn.Dropout):
                raise TypeError(f"the head has a non-linear layer {layer}; it has no single linear equivalent")
        return weight.reshape(-1), bias.reshape(())


class LinearAestheticHead(AestheticHead):
    """The original single-Linear LAION aesthetic predictor."""

    def __init__(self, weight, bias):
        nn.Module.__init__(self)
        self.input_size = weight.shape[1]
        self.layers = nn.Sequential(nn.Linear(self.input_size, 1))
        self.layers[0].load_state_dict({"weight": weight, "bias": bias})
        self.eval()


# ------------------------------------------------------------------------------------------------ the CLIP encoder

def vit_l14_vision_config(**overrides):
    """transformers CLIPVisionConfig of OpenAI's CLIP ViT-L/14 (224 px) image tower: 24 layers, width 1024, 16 heads."""
    with needs_extra("align", "the aesthetic reward's CLIP image encoder"):
        from transformers import CLIPVisionConfig

    fields = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                  image_size=224, patch_size=14, projection_dim=768, hidden_act="quick_gelu", layer_norm_eps=1e-5)
    fields.update(overrides)
    if "initializer_factor" in fields:  # transformers' config is strictly typed: 32 must be 32.0
        fields["initializer_factor"] = float(fields["initializer_factor"])
    return CLIPVisionConfig(**fields)


def random_clip_vision(config=None, seed: int = 0):
    """A CLIPVisionModelWithProjection with random (transformers-initialised) weights; ViT-L/14 shape by default.

    Random weights are no stand-in for trained ones in what they score; they only show how the architecture carries
    rounding error (and they understate it: trained weights have larger, structured activations).
    """
    with needs_extra("align", "the aesthetic reward's CLIP image encoder"):
        from transformers import CLIPVisionModelWithProjection

    config = config or vit_l14_vision_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CLIPVisionModelWithProjection(config)
    return model.eval()


def load_clip_vision(path: str | os.PathLike):
    """CLIP image encoder (transformers CLIPVisionModelWithProjection, eval, frozen) from a local path.

    `path` is a transformers directory (config.json + weights, a full CLIPModel or the vision tower with projection)
    or a file holding an OpenAI CLIP state dict (`visual.*` keys, plain or TorchScript).
    """
    path = Path(path)
    if path.is_dir():
        model = _load_transformers_clip(path)
    elif path.is_file():
        model = clip_vision_from_openai_state_dict(_load_openai_state_dict(path))
    else:
        raise FileNotFoundError(f"CLIP model {path} not found: give a local transformers CLIP directory "
                                "(save_pretrained output) or an OpenAI CLIP state-dict file")
    model.eval().requires_grad_(False)
    return model


def _load_transformers_clip(directory: Path):
    with needs_extra("align", "the aesthetic reward's CLIP image encoder"):
        from transformers import CLIPVisionModelWithProjection

    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory} has no config.json: it is not a transformers model directory")
    model, info = CLIPVisionModelWithProjection.from_pretrained(directory, local_files_only=True,
                                                                output_loading_info=True)
    missing = [key for key in info.get("missing_keys", []) if "position_ids" not in key]
    if missing:
        raise ValueError(f"{directory} lacks weights of the CLIP image tower ({', '.join(sorted(missing)[:4])} ...): "
                         "a CLIPVisionModel without visual_projection cannot give CLIP embeddings; save the full "
                         "CLIPModel or a CLIPVisionModelWithProjection")
    return model


def _load_openai_state_dict(path: Path) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # OpenAI's released .pt files are TorchScript archives, not pickled state dicts
        try:
            state = torch.jit.load(str(path), map_location="cpu").state_dict()
        except Exception:
            raise ValueError(f"could not read {path} as a state dict ({error}) nor as a TorchScript archive") from error
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    return dict(state)


def clip_vision_from_openai_state_dict(state: dict):
    """Convert OpenAI CLIP ViT image-tower weights (`visual.*`, or the same keys without the prefix) to transformers."""
    with needs_extra("align", "the aesthetic reward's CLIP image encoder"):
        from transformers import CLIPVisionModelWithProjection

    prefix = "visual." if any(key.startswith("visual.") for key in state) else ""
    visual = {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
    if "conv1.weight" not in visual or "proj" not in visual:
        raise ValueError("not an OpenAI CLIP ViT state dict: expected visual.conv1.weight and visual.proj "
                         f"(found {sorted(state)[:5]} ...); ResNet CLIP image towers are not supported")
    width, _, patch, _ = visual["conv1.weight"].shape
    num_positions = visual["positional_embedding"].shape[0]
    grid = round((num_positions - 1) ** 0.5)
    layers = 1 + max(int(key.split(".")[2]) for key in visual if key.startswith("transformer.resblocks."))
    config = vit_l14_vision_config(
        hidden_size=width, intermediate_size=visual["transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
        num_hidden_layers=layers, num_attention_heads=width // 64, image_size=patch * grid, patch_size=patch,
        projection_dim=visual["proj"].shape[1])
    converted = {
        "vision_model.embeddings.patch_embedding.weight": visual["conv1.weight"],
        "vision_model.embeddings.class_embedding": visual["class_embedding"],
        "vision_model.embeddings.position_embedding.weight": visual["positional_embedding"],
        "vision_model.pre_layrnorm.weight": visual["ln_pre.weight"],
        "vision_model.pre_layrnorm.bias": visual["ln_pre.bias"],
        "vision_model.post_layernorm.weight": visual["ln_post.weight"],
        "vision_model.post_layernorm.bias": visual["ln_post.bias"],
        "visual_projection.weight": visual["proj"].t(),
    }
    renames = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "attn.out_proj": "self_attn.out_proj",
               "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
    for i in range(layers):
        source, target = f"transformer.resblocks.{i}.", f"vision_model.encoder.layers.{i}."
        for name in ("weight", "bias"):
            for old, new in renames.items():
                converted[f"{target}{new}.{name}"] = visual[f"{source}{old}.{name}"]
            # OpenAI packs q, k, v into one in_proj of shape (3*width, width)
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), visual[f"{source}attn.in_proj_{name}"].chunk(3)):
                converted[f"{target}self_attn.{part}.{name}"] = chunk
    model = CLIPVisionModelWithProjection(config)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in converted.items()}, strict=False)
    missing = [key for key in missing if "position_ids" not in key]
    if missing or unexpected:
        raise ValueError(f"OpenAI CLIP conversion mismatch: missing {missing[:4]}, unexpected {unexpected[:4]}")
    return model


# ------------------------------------------------------------------------------------------------------ the scorer

class AestheticScorer(nn.Module):
    """LAION aesthetic score of images: `scorer(images (B,3,H,W) in [0,1], prompts=None) -> float32 (B,)`.

    `clip_path`: local CLIP (see load_clip_vision) or an already built CLIPVisionModelWithProjection.
    `head_path`: the LAION head .pth (default: $DALLE_LAB_AESTHETIC_HEAD), or pass `head=` an AestheticHead.
    `precision`: one of fp32 / bf16 / fp16 / tpu_default (dalle_lab.numerics.modes); preprocessing always runs in
    float32 (as an image processor would), the encoder and head run in the chosen precision.
    The weights are frozen; gradients flow to the images.
    """

    # precision modes change the weights' dtype and global flags for the duration of a call, so calls that switch
    # precision are serialised (a class attribute: scorers stay deep-copyable and picklable)
    precision_lock = threading.RLock()

    def __init__(self, clip_path, head_path=None, device="cpu", precision: str = "fp32", *, head=None):
        super().__init__()
        self.precision = check_mode(precision)
        if isinstance(clip_path, nn.Module):
            self.vision, settings = clip_path, {}
        else:
            self.vision = load_clip_vision(clip_path)
            settings = preprocessor_settings(Path(clip_path)) if Path(clip_path).is_dir() else {}
        self.image_size = int(self.vision.config.image_size)
        self.image_mean = settings.get("mean", CLIP_MEAN)
        self.image_std = settings.get("std", CLIP_STD)
        if head is None:
            head_path = head_path or os.environ.get(HEAD_PATH_ENV)
            if not head_path:
                raise ValueError("the aesthetic scorer needs the LAION head: pass head_path= (the published "
                                 f"sac+logos+ava1-l14-linearMSE.pth) or set ${HEAD_PATH_ENV}")
            head = AestheticHead.from_file(head_path)
        self.head = head
        embed_dim = int(self.vision.config.projection_dim)
        if embed_dim != head.input_size:
            raise ValueError(f"the CLIP model gives {embed_dim}-dim embeddings but the head expects {head.input_size} "
                             "(the LAION ViT-L/14 head needs a ViT-L/14 CLIP)")
        self.eval().requires_grad_(False)
        self.to(device)
        self.last_precision = None  # PrecisionHandle of the latest call (tpu_default: the products it rounded)

    def preprocess(self, images):
        return clip_preprocess(images, self.image_size, self.image_mean, self.image_std)

    def encode(self, images, precision: str | None = None, output_hidden_states: bool = False):
        """One pass in `precision` (default: the scorer's): (encoder output, unit embeddings (B,D), scores (B,)).

        The encoder output holds `hidden_states` when asked for (the parity report's per-layer comparison).
        """
        pixels = self.preprocess(images.to(self.head.layers[0].weight.device))
        mode = check_mode(precision or self.precision)
        with self.precision_lock, precision_mode(self, mode) as handle:
            dtype = self.vision.visual_projection.weight.dtype
            out = self.vision(pixel_values=pixels.to(dtype), output_hidden_states=output_hidden_states)
            embeds = out.image_embeds
            embeds = embeds / torch.linalg.vector_norm(embeds, dim=-1, keepdim=True)
            scores = self.head(embeds)
        self.last_precision = handle
        return out, embeds.float(), scores.float()

    def embed(self, images, precision: str | None = None):
        """L2-normalised CLIP image embeddings (B, D), float32."""
        return self.encode(images, precision)[1]

    def score_embeddings(self, embeddings, precision: str | None = None):
        """Head scores of given (unit-norm) CLIP embeddings, in `precision`."""
        with self.precision_lock, precision_mode(self.head, check_mode(precision or self.precision)) as handle:
            scores = self.head(embeddings.to(self.head.layers[0].weight.dtype))
        self.last_precision = handle
        return scores.float()

    def hidden_states(self, images, precision: str | None = None):
        """Per-layer encoder hidden states (embeddings output, then each layer), each float32 (B, tokens, width)."""
        out, _, _ = self.encode(images, precision, output_hidden_states=True)
        return [state.float() for state in out.hidden_states]

    def forward(self, images, prompts=None, precision: str | None = None):
        """Aesthetic scores (B,) float32 (prompts are ignored: the score depends on the image alone)."""
        return self.encode(images, precision)[2]


def aesthetic_reward(clip_path: str, head_path: str | None = None, precision: str = "fp32", device=None) -> Callable:
    """The LAION improved aesthetic predictor as a reward (CLIP ViT-L/14 weights from a local path).

    The scorer in the reward signature (registry.py names it "aesthetic"). Differentiable in float32, so it can also
    drive reward backpropagation.
    """
    kwargs = {"precision": precision}
    if head_path is not None:
        kwargs["head_path"] = head_path
    if device is not None:
        kwargs["device"] = device
    scorer = AestheticScorer(clip_path, **kwargs)

    def aesthetic(images, prompts=None):
        return scorer(images).float().reshape(-1)

    aesthetic.differentiable = True
    aesthetic.scorer = scorer
    return aesthetic
