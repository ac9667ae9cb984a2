"""A small CLIP of the project's own (transformers `CLIPModel`, text tower over the project's BPE vocabulary) and the
differentiable `clip_score` reward built on it.

A directory written by `python -m dalle_lab.rewards.clip_train` is a standard transformers CLIP directory
(`config.json`, `model.safetensors`, `preprocessor_config.json`), so `load_clip_vision` and any tool reading CLIP
directories load its image tower unchanged, plus two files of ours:

    text_vocab.model     the BPE vocabulary its text tower reads (a copy, so the directory is self-contained)
    dalle_lab_clip.json  how to tokenise (context length, end-of-text id), the training config, its evaluation

The package ships one trained on the Shapes training captions (`dalle_lab/assets/shapes_clip`, see SHIPPED_CLIP_DIR).

    scorer = ClipScorer()                           # the shipped Shapes CLIP, float32, CPU
    scores = scorer(images, captions)               # CLIPScore: 2.5 * max(cos(image, caption), 0), (B,) float32
    cos = scorer.cosine(images, captions, precision="tpu_default")
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from dalle_lab.assets import ASSETS_DIR
from dalle_lab.extras import needs_extra
from dalle_lab.numerics.modes import check_mode, precision_mode
from dalle_lab.rewards.preprocess import CLIP_MEAN, CLIP_STD, clip_preprocess, preprocessor_settings
from dalle_lab.tokenizers.base import BOS_ID, EOS_ID, PAD_ID, shorten
from dalle_lab.tokenizers.loading import get_tokenizer

SHIPPED_CLIP_DIR = ASSETS_DIR / "shapes_clip"
CLIP_PATH_ENV = "DALLE_LAB_CLIP_SCORE_PATH"  # where the clip_score reward looks when no path is given
METADATA_FILE = "dalle_lab_clip.json"
VOCAB_FILE = "text_vocab.model"
# CLIPScore (Hessel et al. 2021): w * max(cos, 0) with w = 2.5, which stretches the cosines CLIPs give into [0, 1]-ish.
CLIPSCORE_WEIGHT = 2.5
TRAIN_COMMAND = "python -m dalle_lab.rewards.clip_train --out DIR"


@dataclass
class ClipArchitecture:
    """The shape of the small CLIP; everything else is transformers' CLIPConfig default (quick_gelu, pre-LayerNorm)."""

    image_size: int = 32
    patch_size: int = 8  # a 4x4 grid of patches: 4 times cheaper than patch 4, and enough to tell 3x3 places apart
    vision_width: int = 64
    vision_layers: int = 3
    vision_heads: int = 2
    text_width: int = 64
    text_layers: int = 2
    text_heads: int = 2
    mlp_ratio: int = 4
    embed_dim: int = 64
    context_length: int = 16  # text positions: the longest Shapes caption is 12 tokens, plus end-of-text


def clip_config(arch: ClipArchitecture, vocab_size: int, vision_init_factor: float = 1.0):
    """transformers CLIPConfig for `arch` with the project's token ids (pad 0, bos 2, eos 3; dalle_lab.tokenizers).

    `vision_init_factor` scales the image tower's random initialisation (transformers' `initializer_factor`).
    """
    with needs_extra("align", "the clip_score reward's CLIP"):
        from transformers import CLIPConfig

    # eos_token_id != 2 makes the text tower pool at the first end-of-text token (transformers' rule for id 2 is
    # "the largest id", the OpenAI vocabulary's convention, which ours does not follow)
    text = dict(vocab_size=vocab_size, hidden_size=arch.text_width, intermediate_size=arch.mlp_ratio * arch.text_width,
                num_hidden_layers=arch.text_layers, num_attention_heads=arch.text_heads,
                max_position_embeddings=arch.context_length, pad_token_id=PAD_ID, bos_token_id=BOS_ID,
                eos_token_id=EOS_ID, projection_dim=arch.embed_dim)
    vision = dict(hidden_size=arch.vision_width, intermediate_size=arch.mlp_ratio * arch.vision_width,
                  num_hidden_layers=arch.vision_layers, num_attention_heads=arch.vision_heads,
                  image_size=arch.image_size, patch_size=arch.patch_size, projection_dim=arch.embed_dim,
                  initializer_factor=float(vision_init_factor))
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=arch.embed_dim)


def new_clip(arch: ClipArchitecture, vocab_size: int, seed: int = 0, vision_init_factor: float = 1.0):
    """A randomly initialised CLIPModel of this shape (seeded, without touching the global RNG)."""
    with needs_extra("align", "the clip_score reward's CLIP"):
        from transformers import CLIPModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return CLIPModel(clip_config(arch, vocab_size, vision_init_factor))


def caption_ids(tokenizer, captions: Sequence[str], context_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), each (B, T <= context_length): the caption's BPE ids, end-of-text, then pad."""
    encoded = [tokens + [EOS_ID] for tokens in tokenizer.encode_batch(list(captions))]
    for caption, tokens in zip(captions, encoded):
        if len(tokens) > context_length:
            raise ValueError(f"caption {shorten(caption)} is {len(tokens) - 1} tokens long but this CLIP reads at "
                             f"most {context_length - 1} (its context_length {context_length} includes end-of-text)")
    # padded to the longest caption of the batch only: the causal text tower gives the same embeddings either way
    length = max((len(tokens) for tokens in encoded), default=1)
    ids = torch.full((len(captions), length), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(captions), length), dtype=torch.long)
    for row, tokens in enumerate(encoded):
        ids[row, :len(tokens)] = torch.tensor(tokens)
        mask[row, :len(tokens)] = 1
    return ids, mask


def text_embeddings(model, input_ids, attention_mask):
    """Projected (not normalised) caption embeddings (B, D); the end-of-text token's state, as CLIP pools."""
    return model.text_projection(model.text_model(input_ids=input_ids, attention_mask=attention_mask).pooler_output)


def image_embeddings(model, pixel_values, output_hidden_states: bool = False):
    """(vision tower output, projected image embeddings (B, D)) of preprocessed pixels."""
    out = model.vision_model(pixel_values=pixel_values, output_hidden_states=output_hidden_states)
    return out, model.visual_projection(out.pooler_output)


def unit(embeddings):
    return embeddings / torch.linalg.vector_norm(embeddings, dim=-1, keepdim=True)


# ------------------------------------------------------------------------------------------------ directories

def check_clip_output(directory) -> Path:
    """Refuse an output path that saving would destroy: only a new/empty folder or a CLIP directory is replaced."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{directory} is a file; give a folder as --out")
    if directory.is_dir() and any(directory.iterdir()) and not (directory / METADATA_FILE).is_file():
        raise ValueError(f"{directory} exists and is not a dalle_lab CLIP directory (no {METADATA_FILE}); "
                         "give a new or empty folder as --out: an existing CLIP directory is replaced, nothing else")
    return directory


def save_clip(model, tokenizer, arch: ClipArchitecture, directory, extra: dict | None = None) -> Path:
    """Write a CLIP directory: save_pretrained, the preprocessing settings, the vocabulary and our metadata.

    Written into a temporary sibling directory and renamed into place, so an interrupted save leaves no half model.
    """
    directory = check_clip_output(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        model.save_pretrained(tmp)
        # what transformers' CLIPImageProcessor reads (no resize or crop at the native size); clip_preprocess too
        processor = {"image_processor_type": "CLIPImageProcessor", "do_resize": True, "size": {"shortest_edge": arch.image_size},
                     "do_center_crop": True, "crop_size": {"height": arch.image_size, "width": arch.image_size},
                     "do_normalize": True, "image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD),
                     "do_rescale": True, "rescale_factor": 1 / 255, "resample": 3, "do_convert_rgb": True}
        (tmp / "preprocessor_config.json").write_text(json.dumps(processor, indent=1) + "\n")
        shutil.copyfile(tokenizer.path, tmp / VOCAB_FILE)
        metadata = {"format": "dalle_lab clip 1", "architecture": asdict(arch), "vocab_file": VOCAB_FILE,
                    "vocab_sha256": tokenizer.sha256, "vocab_source": tokenizer.path.name, **(extra or {})}
        (tmp / METADATA_FILE).write_text(json.dumps(metadata, indent=1) + "\n")
        for path in tmp.iterdir():
            os.chmod(path, 0o644)
        os.chmod(tmp, 0o755)
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return directory


def resolve_clip_path(path=None) -> Path:
    """The CLIP directory to use: `path`, else $DALLE_LAB_CLIP_SCORE_PATH, else the shipped Shapes CLIP."""
    return Path(path or os.environ.get(CLIP_PATH_ENV) or SHIPPED_CLIP_DIR).expanduser()


def load_clip(path=None):
    """(CLIPModel eval and frozen, tokenizer, metadata dict) from a directory written by `save_clip`."""
    with needs_extra("align", "the clip_score reward's CLIP"):
        from transformers import CLIPModel

    directory = resolve_clip_path(path)
    if not directory.is_dir():
        hint = (f"the shipped Shapes CLIP is missing from this install; rebuild it with "
                f"`python -m dalle_lab.rewards.clip_train --out {SHIPPED_CLIP_DIR}`") if directory == SHIPPED_CLIP_DIR \
            else f"give a directory written by `{TRAIN_COMMAND}`"
        raise FileNotFoundError(f"CLIP model {directory} not found: {hint}")
    meta_path = directory / METADATA_FILE
    if not meta_path.is_file():
        raise ValueError(f"{directory} has no {METADATA_FILE}: clip_score needs a CLIP trained by `{TRAIN_COMMAND}`, "
                         "whose text tower reads the project's BPE vocabulary (other CLIPs' text tokenizers are not "
                         "supported; their image towers load with dalle_lab.rewards.aesthetic.load_clip_vision)")
    try:
        metadata = json.loads(meta_path.read_text())
        arch = ClipArchitecture(**metadata["architecture"])
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{meta_path} is not a valid dalle_lab CLIP metadata file ({error}); retrain with "
                         f"`{TRAIN_COMMAND}`") from None
    vocab = directory / metadata.get("vocab_file", VOCAB_FILE)
    if not vocab.is_file():
        raise FileNotFoundError(f"{directory} lacks its text vocabulary {vocab.name}: copy the BPE file it was trained "
                                f"with there, or retrain with `{TRAIN_COMMAND}`")
    tokenizer = get_tokenizer(vocab)
    if metadata.get("vocab_sha256") and tokenizer.sha256 != metadata["vocab_sha256"]:
        raise ValueError(f"{vocab} is not the vocabulary this CLIP was trained with (sha256 {tokenizer.sha256[:12]} "
                         f"!= {metadata['vocab_sha256'][:12]}); restore the original file or retrain")
    try:
        model = CLIPModel.from_pretrained(directory, local_files_only=True)
    except Exception as error:  # safetensors, torch and transformers each raise their own kinds
        raise ValueError(f"cannot load the CLIP weights in {directory} ({type(error).__name__}: "
                         f"{str(error).splitlines()[0][:200]}); retrain with `{TRAIN_COMMAND}`") from None
    model.eval().requires_grad_(False)
    return model, tokenizer, {**metadata, "architecture": arch}


# ------------------------------------------------------------------------------------------------ the scorer

class ClipScorer(nn.Module):
    """Caption-image agreement from a dalle_lab CLIP: CLIPScore `2.5 * max(cos, 0)`, differentiable in the images.

    `precision` ("fp32", "bf16", "fp16", "tpu_default") is the default for calls; both towers run in it (the reward
    as a fine-tuning run in that precision would compute it). Caption embeddings are cached per precision, since
    prompts repeat across epochs and have no gradient. The weights are frozen.
    """

    precision_lock = threading.RLock()  # precision modes swap weights and global flags for the length of a call

    def __init__(self, path=None, device="cpu", precision: str = "fp32", *, model=None, tokenizer=None,
                 context_length: int | None = None):
        super().__init__()
        self.precision = check_mode(precision)
        if model is None:
            model, tokenizer, metadata = load_clip(path)
            self.path = resolve_clip_path(path)
            context_length = metadata["architecture"].context_length
            settings = preprocessor_settings(self.path)
        else:
            if tokenizer is None or context_length is None:
                raise ValueError("ClipScorer(model=...) also needs tokenizer= and context_length=")
            self.path, settings = None, {"mean": CLIP_MEAN, "std": CLIP_STD}
        self.model, self.tokenizer, self.context_length = model, tokenizer, int(context_length)
        self.image_size = int(model.config.vision_config.image_size)
        self.image_mean, self.image_std = settings["mean"], settings["std"]
        self.eval().requires_grad_(False)
        self.to(device)
        self._text_cache: dict[tuple[str, str], torch.Tensor] = {}
        self.last_precision = None  # PrecisionHandle of the latest call

    @property
    def device(self):
        return self.model.logit_scale.device

    def preprocess(self, images):
        return clip_preprocess(images.to(self.device), self.image_size, self.image_mean, self.image_std)

    def encode_images(self, images, precision: str | None = None, output_hidden_states: bool = False):
        """(vision tower output, unit image embeddings (B, D) float32) in `precision`; keeps the graph to the pixels."""
        pixels = self.preprocess(images)
        with self.precision_lock, precision_mode(self.model, check_mode(precision or self.precision)) as handle:
            dtype = self.model.visual_projection.weight.dtype
            out, embeds = image_embeddings(self.model, pixels.to(dtype), output_hidden_states)
            embeds = unit(embeds.float())
        self.last_precision = handle
        return out, embeds

    def encode_text(self, captions: Sequence[str], precision: str | None = None):
        """Unit caption embeddings (B, D) float32 in `precision` (cached; no gradient)."""
        mode = check_mode(precision or self.precision)
        missing = list(dict.fromkeys(c for c in captions if (mode, c) not in self._text_cache))
        if missing:
            ids, mask = caption_ids(self.tokenizer, missing, self.context_length)
            with torch.no_grad(), self.precision_lock, precision_mode(self.model, mode):
                embeds = unit(text_embeddings(self.model, ids.to(self.device), mask.to(self.device)).float())
            self._text_cache.update({(mode, caption): e for caption, e in zip(missing, embeds)})
        return torch.stack([self._text_cache[(mode, caption)] for caption in captions])

    def cosine(self, images, captions: Sequence[str], precision: str | None = None):
        """Cosine similarity of each image with its caption, (B,) float32."""
        if captions is None or len(captions) != len(images):
            raise ValueError(f"clip_score needs one caption per image (got "
                             f"{None if captions is None else len(captions)} captions for {len(images)} images)")
        _, image = self.encode_images(images, precision)
        return (image * self.encode_text(list(captions), precision).to(image.device)).sum(-1)

    def forward(self, images, prompts=None, precision: str | None = None):
        """CLIPScore of each image with its caption: 2.5 * max(cos, 0), (B,) float32."""
        return clipscore(self.cosine(images, prompts, precision))


def clipscore(cosine):
    """CLIPScore's rescaling of a cosine similarity (Hessel et al. 2021): w * max(cos, 0), w = 2.5."""
    return CLIPSCORE_WEIGHT * cosine.clamp(min=0)


def clip_score_reward(clip_score_path=None, precision: str = "fp32", device=None):
    """`reward(images, prompts)`: CLIPScore of each image with its caption under a dalle_lab CLIP (default: shipped)."""
    scorer = ClipScorer(clip_score_path, device=device or "cpu", precision=precision)

    def clip_score(images, prompts=None):
        return scorer(images, prompts).reshape(-1)

    clip_score.differentiable = True
    clip_score.scorer = scorer
    return clip_score
