"""DALLEConfig: every hyper-parameter of the DALLE transformer, in one place.

The defaults are the main job's defaults (the Shapes data: 32 px images -> 8x8 VQGAN tokens, short captions).
train_dalle.py takes its flag defaults from this dataclass and checkpoints store `dataclasses.asdict(config)`,
so `DALLEConfig(**saved)` rebuilds exactly the model that was trained.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

# DALLE-pytorch's attention types this package implements as masks (dalle_lab/model/masks.py).
ATTN_TYPES = ("full", "axial_row", "axial_col", "conv_like")
# rotary_style / stable_style: this package's variant, or DALLE-pytorch 1.6.6's (for converted checkpoints)
STYLES = ("dalle_lab", "dallepytorch")
# DALLE-pytorch's rotary as a --fp16 (or bf16) file stores it: its table of angles rounded to that dtype, which its
# model then used (a converted model computes the same function only with the same rounded angles)
ROTARY_STYLES = STYLES + ("dallepytorch_fp16", "dallepytorch_bf16")
ATTENTION_MATHS = ("sdpa", "dallepytorch")


@dataclass
class DALLEConfig:
    # width 192 (6 heads of 32): at the main job's fixed minutes, 2000 steps of this model beat 1200 of width 256
    # on unseen captions (lab/studies/recipe/results/: more optimizer steps were the lever, not width)
    dim: int = 192  # model width
    depth: int = 4  # number of transformer blocks
    heads: int = 6
    dim_head: int = 32
    num_text_tokens: int = 512  # the text tokenizer's vocab_size (pad id 0 included); set from the tokenizer
    text_seq_len: int = 12  # text tokens per caption (padded with 0); Shapes captions are at most 12 tokens
    num_image_tokens: int = 512  # codebook size of the image tokenizer (vae.num_tokens when a vae is given)
    image_fmap_size: int = 8  # side of the image-token grid (vae.fmap_size when a vae is given)
    loss_img_weight: float = 7.0  # loss = (loss_text + w * loss_img) / (w + 1); DALL-E used 7, CogView 1
    stable: bool = False  # CogView PB-relax in attention and before the final LayerNorm (see docs/model.md)
    sandwich_norm: bool = False  # LayerNorm on the output of every residual branch (CogView sandwich-LN)
    attn_dropout: float = 0.0
    ff_dropout: float = 0.0
    ff_mult: int = 4  # feed-forward hidden width = ff_mult * dim (GEGLU, as DALLE-pytorch)
    null_cond_prob: float = 0.1  # training: drop the caption (all-pad text) with this probability, for guidance
    # DALLE-pytorch's architecture options (docs/model.md, "Attention types and position tricks"). All off by
    # default: the defaults are the model every existing checkpoint holds, and none was shown to help at this size.
    attn_types: tuple[str, ...] = ("full",)  # cycled over the layers: full, axial_row, axial_col, conv_like
    conv_kernel_size: int = 5  # conv_like: the local window's side (in grid cells, before dilation)
    conv_dilation: int = 1  # conv_like: spacing between the window's cells
    rotary_emb: bool = False  # rotary position embedding on queries and keys (text position; image row and column)
    shift_tokens: bool = False  # token shift: features from the previous token and, for image tokens, the one above
    shared_attn_ids: tuple[int, ...] | None = None  # cycled over the layers; layers with equal ids share attention
    shared_ff_ids: tuple[int, ...] | None = None  # likewise for the feed-forward
    share_input_output_emb: bool = False  # tie the token embeddings with the output heads (text and image)
    # DALLE-pytorch's numerics, for models converted from it (dalle_lab.convert; docs/migrating.md). Off by default.
    layer_scale: bool = False  # CaiT's LayerScale: a learned per-feature scale on every branch output (always on there)
    # "dallepytorch": rotary as DALLE-pytorch 1.6.6 computes it (its frequency tables, values rotated too, no learned
    # positions); "dalle_lab": positional.py's integer-coordinate rotary beside the learned positions
    rotary_style: str = "dalle_lab"
    # "dallepytorch": stable's final rescale divides by the signed maximum (DALLE-pytorch's DivideMax) and scales the
    # embeddings' gradient by 0.1; "dalle_lab": divides by the absolute maximum (model/dalle.py, _final)
    stable_style: str = "dalle_lab"
    # "dallepytorch": attention as DALLE-pytorch 1.6.6 sums it (its batched products, the most negative float as
    # mask, its stable softmax; model/attention.dallepytorch_attention); "sdpa": torch's fused kernel, which sums in
    # another order (converted models differ from their file by up to 2e-5 at dim 512 with it, by 6e-6 without)
    attention_math: str = "sdpa"

    def __post_init__(self):
        # lists (a checkpoint read back from JSON, a YAML config) and "full,axial_row" strings (DALLE-pytorch's
        # command-line form) become tuples, so equal configs compare equal
        self.attn_types = _as_tuple(self.attn_types, str, "attn_types")
        self.shared_attn_ids = _as_tuple(self.shared_attn_ids, int, "shared_attn_ids")
        self.shared_ff_ids = _as_tuple(self.shared_ff_ids, int, "shared_ff_ids")
        for name in ("dim", "depth", "heads", "dim_head", "num_text_tokens", "text_seq_len", "num_image_tokens",
                     "image_fmap_size", "ff_mult", "conv_kernel_size", "conv_dilation"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"DALLEConfig.{name} must be a positive integer, got {value!r}")
        if self.num_text_tokens < 2:
            raise ValueError(f"DALLEConfig.num_text_tokens={self.num_text_tokens}: the vocab needs the pad id 0 and at "
                             "least one real token; pass the tokenizer's vocab_size")
        if self.loss_img_weight < 0:
            raise ValueError(f"DALLEConfig.loss_img_weight must be >= 0, got {self.loss_img_weight}")
        for name in ("attn_dropout", "ff_dropout", "null_cond_prob"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"DALLEConfig.{name} must be in [0, 1), got {value}")

        if not self.attn_types:
            raise ValueError("DALLEConfig.attn_types is empty; give at least one of " + ", ".join(ATTN_TYPES))
        for kind in self.attn_types:
            if kind == "sparse":
                raise ValueError("attn_types 'sparse' (DeepSpeed's block-sparse attention) is not supported: it needs "
                                 "triton and a CUDA GPU; use conv_like or axial_row / axial_col, which give local "
                                 "sparsity as masks on any device")
            if kind not in ATTN_TYPES:
                raise ValueError(f"unknown attention type {kind!r} in attn_types; choose from {', '.join(ATTN_TYPES)}")
        if self.rotary_emb and self.dim_head < 6:
            raise ValueError(f"rotary_emb needs dim_head >= 6 (three rotated bands of at least 2 features: text "
                             f"position, image row, image column), got dim_head={self.dim_head}")
        for name, allowed in (("rotary_style", ROTARY_STYLES), ("stable_style", STYLES),
                              ("attention_math", ATTENTION_MATHS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"DALLEConfig.{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        for name in ("shared_attn_ids", "shared_ff_ids"):
            if getattr(self, name) == ():
                raise ValueError(f"DALLEConfig.{name} is empty; leave it None for no sharing")

    def layer_attn_types(self) -> list[str]:
        """The attention type of each layer: attn_types cycled over depth (DALLE-pytorch's rule)."""
        return [self.attn_types[i % len(self.attn_types)] for i in range(self.depth)]

    @property
    def learned_positions(self) -> bool:
        """Whether tokens get learned position embeddings (DALLE-pytorch's rotary replaces them)."""
        return not (self.rotary_emb and self.rotary_style.startswith("dallepytorch"))

    @property
    def image_seq_len(self) -> int:
        return self.image_fmap_size ** 2

    @property
    def seq_len(self) -> int:
        """Length of the transformer's input: BOS + text + image tokens, minus the last image token (never fed)."""
        return self.text_seq_len + self.image_seq_len

    @property
    def total_text_tokens(self) -> int:
        """Text embedding rows: the tokenizer vocab plus one unique pad id per text position."""
        return self.num_text_tokens + self.text_seq_len

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DALLEConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown DALLEConfig fields {unknown}: this checkpoint or config was written by another "
                             f"version of dalle_lab; known fields are {sorted(known)}")
        return cls(**data)


def _as_tuple(value, kind, name):
    """None stays None; a comma-separated string or any sequence becomes a tuple of `kind`."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    try:
        return tuple(kind(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"DALLEConfig.{name} must be a comma-separated list of {kind.__name__}, got {value!r}") from None
