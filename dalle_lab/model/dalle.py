"""DALLE: text tokens and image tokens in one causal transformer (DALL-E / CogView style).

Sequence layout (length text_seq_len + image_seq_len fed to the transformer):

    input:   [BOS] t_1 ... t_T  i_1 ... i_{N-1}
    target:   t_1  t_2 ... i_1  i_2 ... i_N

- Text comes padded with id 0. Each pad is replaced by a pad id unique to its position
  (num_text_tokens + position), so a padded caption still tells the model where it is and how long the caption was.
  Id 0 itself is then free and serves as BOS (as in DALLE-pytorch): BOS lets the model predict the first text token.
- Text positions predict text ids only and image positions image ids only. This logits mask is built into the
  model's structure: two output heads (text vocab, image vocab) applied to their own positions, which equals
  masking a joint head's logits with -inf but skips the masked matmul work. `forward` returns the joint masked
  logits for callers that want DALLE-pytorch's layout.
- Position embeddings are learned: one vector per text position, and row + column vectors for the image grid.
  Absolute learned positions cost one add per token, give the image tokens their 2-D neighbourhood directly, and
  make cached generation trivial (a token's embedding never depends on the others); the sequences are short and
  fixed-length, which is where rotary's length extrapolation would have helped, so it buys nothing here.
  DALLE-pytorch's rotary embeddings, token shift, sparse attention types, layer sharing and tied embeddings are
  options (DALLEConfig; masks.py, positional.py, transformer.py), off by default.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..generate import DEFAULT_WINDOW, GenerationConfig, generate
from ..generate.text import generate_texts
from ..vae.images import decode_images
from . import fused_step as fused
from .config import DALLEConfig
from .linear import Linear, packed_linears
from .transformer import Transformer

# DALLE-pytorch primes with the top 14 of 32 rows when no count is given; same fraction here.
DEFAULT_PRIME_FRACTION = 14 / 32
# stable_style="dallepytorch": the embeddings' share of the gradient (DALLE-pytorch's alpha)
_DP_EMBED_GRAD_SHRINK = 0.1


class DALLEOutput(NamedTuple):
    loss: torch.Tensor | None  # (loss_text + w * loss_img) / (w + 1)
    loss_text: torch.Tensor | None
    loss_img: torch.Tensor | None
    logits: torch.Tensor | None  # (B, T + N, total_text_tokens + num_image_tokens), masked: the most negative float


class DALLE(nn.Module):
    """The text-to-image transformer.

    `DALLE(vae=vae, dim=256, depth=4, ...)` takes DALLE-pytorch's keywords (any DALLEConfig field), or
    `DALLE.from_config(cfg, vae)`. With a vae, num_image_tokens and image_fmap_size come from it.
    The vae is held for encoding pixels and decoding generated tokens, but it is NOT a registered submodule: its
    weights are not in `state_dict()` or `parameters()` (checkpoints record its identity instead); moving the
    model to a device moves it too, dtype changes (.half(), .bfloat16()) leave it alone.
    """

    def __init__(self, *, vae=None, config: DALLEConfig | None = None, **fields):
        super().__init__()
        _drop_dallepytorch_switches(fields)
        if config is not None and fields:
            raise ValueError(f"give either config= or keyword fields, not both (got fields {sorted(fields)})")
        if config is None:
            if vae is not None:
                for name, value in (("num_image_tokens", vae.num_tokens), ("image_fmap_size", vae.fmap_size)):
                    if fields.get(name, value) != value:
                        raise ValueError(f"{name}={fields[name]} disagrees with the vae's {value}; leave it out")
                    fields[name] = value
            config = DALLEConfig(**fields)
        elif vae is not None and (vae.num_tokens, vae.fmap_size) != (config.num_image_tokens, config.image_fmap_size):
            raise ValueError(f"config has num_image_tokens={config.num_image_tokens}, image_fmap_size="
                             f"{config.image_fmap_size} but the vae has {vae.num_tokens}, {vae.fmap_size}: "
                             "this model was trained with another image tokenizer")
        self.config = cfg = config
        object.__setattr__(self, "vae", vae)  # plain attribute: keeps the frozen VAE out of state_dict()

        dim = cfg.dim
        self.text_emb = nn.Embedding(cfg.total_text_tokens, dim)
        self.image_emb = nn.Embedding(cfg.num_image_tokens, dim)
        if cfg.learned_positions:  # DALLE-pytorch's rotary (rotary_style="dallepytorch") is the only position signal
            self.text_pos_emb = nn.Embedding(cfg.text_seq_len + 1, dim)  # BOS + text positions
            self.image_row_emb = nn.Embedding(cfg.image_fmap_size, dim)
            self.image_col_emb = nn.Embedding(cfg.image_fmap_size, dim)
        self.transformer = Transformer(dim, cfg.depth, cfg.heads, cfg.dim_head, cfg.ff_mult, cfg.attn_dropout,
                                       cfg.ff_dropout, cfg.stable, cfg.sandwich_norm, attn_types=cfg.attn_types,
                                       text_len=cfg.text_seq_len + 1, fmap=cfg.image_fmap_size,
                                       conv_kernel_size=cfg.conv_kernel_size, conv_dilation=cfg.conv_dilation,
                                       rotary_emb=cfg.rotary_emb, shift_tokens=cfg.shift_tokens,
                                       shared_attn_ids=cfg.shared_attn_ids, shared_ff_ids=cfg.shared_ff_ids,
                                       layer_scale=cfg.layer_scale, rotary_style=cfg.rotary_style,
                                       attention_math=cfg.attention_math)
        self.final_norm = nn.LayerNorm(dim)
        self.to_text_logits = Linear(dim, cfg.total_text_tokens)
        self.to_image_logits = Linear(dim, cfg.num_image_tokens)
        if cfg.share_input_output_emb:
            # DALLE-pytorch's share_input_output_emb: one (tokens, dim) matrix embeds a token and scores it as the
            # next token (the heads keep their biases). Both state_dict keys stay, holding the same tensor.
            self.text_emb.weight = self.to_text_logits.weight
            self.image_emb.weight = self.to_image_logits.weight
        self.register_buffer("text_pad_ids", cfg.num_text_tokens + torch.arange(cfg.text_seq_len), persistent=False)
        # Position indices. Embeddings are always looked up through their modules (never `.weight` directly), so
        # DeepSpeed ZeRO-3, which gathers a module's parameters only around its forward, works.
        cells = torch.arange(cfg.image_seq_len)
        self.register_buffer("text_positions", torch.arange(cfg.text_seq_len + 1), persistent=False)
        self.register_buffer("image_rows", cells // cfg.image_fmap_size, persistent=False)
        self.register_buffer("image_cols", cells % cfg.image_fmap_size, persistent=False)
        self.apply(_init_weights)

    @classmethod
    def from_config(cls, config: DALLEConfig | dict, vae=None) -> "DALLE":
        if isinstance(config, dict):
            config = DALLEConfig.from_dict(config)
        return cls(vae=vae, config=config)

    def _apply(self, fn, *args, **kwargs):
        # The unregistered vae follows the model's device (.to(device), .cuda(), .cpu()) but keeps its own dtype:
        # .half() or DeepSpeed's bf16 conversion of the transformer must not silently change the frozen tokenizer.
        super()._apply(fn, *args, **kwargs)
        param = next(self.parameters(), None)
        if self.vae is not None and param is not None:
            self.vae.to(param.device)
        return self

    # ----- inputs -------------------------------------------------------------------------------------------

    def check_text(self, text: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        if text.dim() != 2 or text.shape[1] != cfg.text_seq_len:
            raise ValueError(f"text must be (batch, text_seq_len={cfg.text_seq_len}) token ids, got shape "
                             f"{tuple(text.shape)}; tokenize with context_length={cfg.text_seq_len}")
        if text.is_floating_point():
            raise ValueError(f"text must hold integer token ids, got dtype {text.dtype}")
        low, high = int(text.min()), int(text.max())
        if low < 0 or high >= cfg.num_text_tokens:
            raise ValueError(f"text token ids must be in [0, num_text_tokens={cfg.num_text_tokens}), got [{low}, "
                             f"{high}]: the tokenizer's vocab is larger than the model's num_text_tokens; build the "
                             "model with num_text_tokens=tokenizer.vocab_size")
        return text.long()

    def image_tokens(self, image: torch.Tensor) -> torch.Tensor:
        """Pixels (B, 3, H, W) in [0, 1] -> token ids through the vae; token ids (B, n) pass through (checked)."""
        cfg = self.config
        if image.dim() == 4:
            if self.vae is None:
                raise ValueError("image given as pixels (B, 3, H, W) but this DALLE has no vae; pass token ids "
                                 "(B, image_seq_len) or build DALLE(vae=...)")
            with torch.no_grad():
                image = self.vae.get_codebook_indices(image)
        if image.dim() != 2 or image.is_floating_point():
            raise ValueError(f"image must be pixels (B, 3, H, W) or token ids (B, n), got {tuple(image.shape)} "
                             f"{image.dtype}")
        if image.numel() and (int(image.min()) < 0 or int(image.max()) >= cfg.num_image_tokens):
            raise ValueError(f"image token ids must be in [0, num_image_tokens={cfg.num_image_tokens}), got "
                             f"[{int(image.min())}, {int(image.max())}]: wrong image tokenizer?")
        return image.long()

    # The pieces below are the interface generation uses (dalle_lab/generate): the prompt as the network reads it,
    # the embeddings of a prefix or of image tokens at any grid cells, the transformer over a KV cache
    # (`self.transformer(x, caches=..., start=...)` or `positions=...`), and the final normalisation before a head.

    def text_ids(self, text: torch.Tensor) -> torch.Tensor:
        """Raw text (0 = pad) -> ids with position-specific pad ids."""
        return torch.where(text == 0, self.text_pad_ids, text)

    def image_positions(self) -> torch.Tensor:
        """(N, dim) position embedding of each image-grid cell, row-major: row vector + column vector (zeros where
        positions are not learned)."""
        if not self.config.learned_positions:
            weight = self.image_emb.weight
            return weight.new_zeros(self.config.image_seq_len, weight.shape[1])
        return self.image_row_emb(self.image_rows) + self.image_col_emb(self.image_cols)

    def embed(self, text_ids: torch.Tensor, image_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """[BOS] + text ids (remapped) + the given image tokens (fed as they are) -> (B, 1 + T + n, dim)."""
        bos_text = F.pad(text_ids, (1, 0), value=0)
        x = self.text_emb(bos_text)
        if self.config.learned_positions:
            x = x + self.text_pos_emb(self.text_positions)
        if image_tokens is not None and image_tokens.shape[1] > 0:
            n = image_tokens.shape[1]
            image = self.image_emb(image_tokens)
            x = torch.cat([x, image + self.image_positions()[:n] if self.config.learned_positions else image], dim=1)
        return self._shrink_embedding_gradient(x)

    def embed_image(self, tokens: torch.Tensor, index: torch.Tensor | int, cells: torch.Tensor | None = None):
        """Image tokens (B, n) at grid cells index (B, n), or all at the one cell `index` (an int) -> (B, n, dim).
        cells: image_positions(), for a caller that embeds many steps (computed once). Indices past the grid (a
        speculative window's slack) take the last cell's position: their outputs are never used."""
        x = self.image_emb(tokens)
        if self.config.learned_positions:
            cells = self.image_positions() if cells is None else cells
            last = self.config.image_seq_len - 1
            x = x + (cells[min(index, last)] if isinstance(index, int) else cells[index.clamp(max=last)])
        return self._shrink_embedding_gradient(x)

    def _shrink_embedding_gradient(self, x: torch.Tensor) -> torch.Tensor:
        if self.config.stable and self.config.stable_style == "dallepytorch":
            # DALLE-pytorch's stable: the same values, a tenth of the gradient into the embeddings (its own
            # arithmetic, so the rounding matches too)
            x = x * _DP_EMBED_GRAD_SHRINK + x.detach() * (1 - _DP_EMBED_GRAD_SHRINK)
        return x

    def final(self, h: torch.Tensor) -> torch.Tensor:
        """The transformer's output -> the normalised hidden state the two heads read."""
        if self.config.stable and self.config.stable_style == "dallepytorch":
            # DALLE-pytorch's DivideMax: by the signed maximum (a row whose features are all negative flips sign)
            return self.final_norm(h / h.amax(dim=-1, keepdim=True).detach())
        if self.config.stable:
            # PB-relax on the final LayerNorm: LayerNorm is invariant to rescaling its input (up to eps), so divide
            # by the absolute maximum first and the norm's own arithmetic never sees large values.
            h = h / h.abs().amax(dim=-1, keepdim=True).detach().clamp_min(torch.finfo(h.dtype).tiny)
        return self.final_norm(h)

    def hidden(self, text_ids, image_tokens, return_attention=False):
        """The normalised hidden states of one full pass over BOS + text + image tokens (no cache)."""
        x = self.embed(text_ids, image_tokens)
        h, attentions = self.transformer(x, return_attention=return_attention)
        return self.final(h), attentions

    def packed_weights(self, rows: int):
        """A context in which every product of the network multiplies `rows`-row inputs with weights packed once
        (linear.packed_linears): for cached decoding, whose passes multiply a few rows at a time."""
        return packed_linears(self, rows)

    def why_not_fused(self) -> str | None:
        """Why the fused one-token step cannot run this model now (sparse attention types, training mode, bf16), or
        None where it can."""
        return fused.why_not_fused(self)

    def fused_step(self, caches, rows: int) -> fused.FusedStep:
        """The one-token step over `caches` (after the prefill wrote them) in few ops: fused_step.py."""
        return fused.FusedStep(self, caches, rows)

    def decode_step(self, x: torch.Tensor, pos: torch.Tensor, io: fused.StepIO) -> torch.Tensor:
        """The fused step's function with fixed shapes for TorchInductor (dalle_lab/generate/compiled.py): pos a 0-d
        tensor, products through F.linear on the modules' own weights (which Inductor freezes); io: a FusedStep's."""
        return fused.step(fused.plan(self, _module_product), x, pos, io)

    # ----- training -----------------------------------------------------------------------------------------

    def forward(self, text: torch.Tensor, image: torch.Tensor, return_loss: bool = False,
                return_logits: bool | None = None, *, return_losses: bool = False,
                null_cond_prob: float | None = None):
        """text (B, text_seq_len) ids, 0 = pad; image pixels (B, 3, H, W) (needs the vae) or ids (B, image_seq_len).

        As DALLE-pytorch: `dalle(text, image)` returns the joint masked logits (B, T + N, text vocab + image vocab),
        masked entries the most negative float; `dalle(text, image, return_loss=True)` returns the loss tensor,
        (loss_text + w * loss_img) / (w + 1). return_losses=True returns DALLEOutput(loss, loss_text, loss_img,
        logits) instead (what the package's own training logs); its logits are built only with return_logits=True,
        since the losses come straight from the two heads.

        Each caption is replaced by the all-pad text with probability null_cond_prob (default: the config's, in
        training mode only; given here, it applies in any mode, as in DALLE-pytorch), so the model also learns the
        unconditional distribution classifier-free guidance needs; those rows are left out of loss_text, whose
        target would then be the pad sequence rather than a caption.
        """
        cfg = self.config
        text = self.check_text(text)
        image = self.image_tokens(image)
        if image.shape != (text.shape[0], cfg.image_seq_len):
            raise ValueError(f"image tokens must be (batch={text.shape[0]}, image_seq_len={cfg.image_seq_len}), got "
                             f"{tuple(image.shape)}")
        if null_cond_prob is None:
            null_cond_prob = cfg.null_cond_prob if self.training else 0.0
        keep_caption = None
        if null_cond_prob > 0:
            keep_caption = torch.rand(text.shape[0], device=text.device) >= null_cond_prob
            text = text * keep_caption[:, None]  # a new tensor: the caller's text is never modified

        text_ids = self.text_ids(text)
        h, _ = self.hidden(text_ids, image[:, :-1])
        T = cfg.text_seq_len
        text_logits = self.to_text_logits(h[:, :T])
        image_logits = self.to_image_logits(h[:, T:])
        wants_loss = return_loss or return_losses
        logits = None
        if return_logits or (return_logits is None and not wants_loss):
            # masked entries hold the most negative float, as DALLE-pytorch's (so its logits compare as they are)
            masked = -torch.finfo(text_logits.dtype).max
            logits = torch.cat([F.pad(text_logits, (0, cfg.num_image_tokens), value=masked),
                                F.pad(image_logits, (cfg.total_text_tokens, 0), value=masked)], dim=1)
        if not wants_loss:
            return logits

        loss_img = F.cross_entropy(image_logits.reshape(-1, cfg.num_image_tokens).float(), image.reshape(-1))
        text_ce = F.cross_entropy(text_logits.reshape(-1, cfg.total_text_tokens).float(), text_ids.reshape(-1),
                                  reduction="none").view(text_ids.shape)
        if keep_caption is None:
            loss_text = text_ce.mean()
        else:
            loss_text = (text_ce * keep_caption[:, None]).sum() / (keep_caption.sum() * T).clamp_min(1)
        w = cfg.loss_img_weight
        loss = (loss_text + w * loss_img) / (w + 1)
        if return_losses:
            return DALLEOutput(loss, loss_text, loss_img, logits)
        return loss

    def logits(self, text: torch.Tensor, image_tokens: torch.Tensor) -> torch.Tensor:
        """Image-token logits (B, n, num_image_tokens) for image positions 0..n-1 given image_tokens (B, n):
        position j is predicted from the text and image tokens 0..j-1 (token j itself is not seen).

        No caption dropout here, in any mode: these are exactly the logits generation samples from.
        """
        text_ids = self.text_ids(self.check_text(text))
        image_tokens = self.image_tokens(image_tokens)
        h, _ = self.hidden(text_ids, image_tokens[:, :-1])
        return self.to_image_logits(h[:, self.config.text_seq_len:])

    def null_text(self, text: torch.Tensor) -> torch.Tensor:
        """The unconditional prompt used for classifier-free guidance: the all-pad text (a new tensor)."""
        return torch.zeros_like(text)

    @torch.no_grad()
    def attention_maps(self, text: torch.Tensor, image_tokens: torch.Tensor) -> torch.Tensor:
        """Attention of the image positions to BOS + text: (depth, B, heads, image_seq_len, 1 + text_seq_len).

        Row j is the query that predicts image token j (the sequence position just before it), i.e. where the
        model looked when it chose grid cell j. Column 0 is BOS, column 1 + t text token t. Uses the explicit
        attention path.
        """
        text_ids = self.text_ids(self.check_text(text))
        image_tokens = self.image_tokens(image_tokens)
        _, attentions = self.hidden(text_ids, image_tokens[:, :-1], return_attention=True)
        T = self.config.text_seq_len
        return torch.stack([a[:, :, T:, : T + 1] for a in attentions])

    # ----- generation: DALLE-pytorch's call, over dalle_lab.generate -----------------------------------------

    def generate_texts(self, tokenizer, text: str | None = None, *, filter_thres: float = 0.5,
                       temperature: float = 1.0, generator: torch.Generator | None = None):
        """DALLE-pytorch's call: continue the caption `text` (None or "": from nothing) with the text head ->
        (text tokens (1, text_seq_len), [the caption]). dalle_lab/generate/text.py has the batched form."""
        prompt = tokenizer.tokenize([text or ""], self.config.text_seq_len, truncate_text=True)
        device = self.text_emb.weight.device
        tokens = generate_texts(self, prompt.to(device), filter_thres=filter_thres, temperature=temperature,
                                generator=generator)
        return tokens, [tokenizer.decode(row) for row in tokens]

    @torch.no_grad()
    def generate_images(self, text: torch.Tensor, *, filter_thres: float | None = None, top_k: int | None = None,
                        top_p: float | None = None, temperature: float = 1.0, cond_scale: float = 1.0,
                        img: torch.Tensor | None = None, num_init_img_tokens: int | None = None,
                        use_cache: bool = True, return_tokens: bool = False, return_logprobs: bool = False,
                        generator: torch.Generator | None = None, strategy: str = "auto",
                        speculative_window: int = DEFAULT_WINDOW,
                        logits_callback: Callable[[int, torch.Tensor, torch.Tensor | None], None] | None = None):
        """Sample image tokens for each caption in text (B, text_seq_len) and decode them with the vae:
        `dalle_lab.generate.generate` with DALLE-pytorch's keywords and defaults (docs/model.md, "Generation").

        filter_thres (keep the top 1 - filter_thres fraction) or top_k, top_p and temperature act on the image
        vocabulary; cond_scale != 1 runs classifier-free guidance. img primes generation with the top of an image:
        pixels (B, 3, H, W) (needs the vae) or token ids (B, >= num_init_img_tokens); num_init_img_tokens defaults
        to 14/32 of the grid. use_cache=False reruns the whole prefix every pass (strategy "uncached"). strategy:
        how the passes run (GenerationConfig's STRATEGIES; "auto" picks the fastest exact one).
        logits_callback(position, logits_cond, logits_uncond_or_None) is called before each token is sampled.

        Returns images (B, 3, H, W) in [0, 1]; with return_tokens the (B, image_seq_len) token ids instead (no vae
        needed); with return_logprobs a pair (images or tokens, logprobs (B, image_seq_len) float32): the
        log-probability of each sampled token under the final sampling distribution, 0 at primed positions.
        """
        if not return_tokens and self.vae is None:
            raise ValueError("this DALLE has no vae to decode images: pass return_tokens=True or build DALLE(vae=...)")
        if not use_cache:
            if strategy not in ("auto", "uncached"):
                raise ValueError(f"use_cache=False reruns the prefix every pass; it cannot use strategy={strategy!r}")
            strategy = "uncached"
        config = GenerationConfig(top_k=top_k, filter_thres=filter_thres, top_p=top_p, temperature=temperature,
                                  cond_scale=cond_scale, strategy=strategy, speculative_window=speculative_window)
        tokens, logprobs = generate(self, text, config, prime=self._prime(text, img, num_init_img_tokens),
                                    generator=generator, logits_callback=logits_callback)
        result = tokens if return_tokens else decode_images(self.vae, tokens)
        return (result, logprobs) if return_logprobs else result

    def _prime(self, text: torch.Tensor, img: torch.Tensor | None, num_init_img_tokens: int | None):
        """The image tokens generation keeps from img (B, n_init), or None: DALLE-pytorch's priming rule."""
        if img is None:
            if num_init_img_tokens:
                raise ValueError("num_init_img_tokens needs img (pixels or token ids) to prime with")
            return None
        N = self.config.image_seq_len
        prime = self.image_tokens(img)
        n_init = int(DEFAULT_PRIME_FRACTION * N) if num_init_img_tokens is None else num_init_img_tokens
        if not 0 <= n_init < N or prime.shape[1] < n_init or prime.shape[0] != text.shape[0]:
            raise ValueError(f"priming needs 0 <= num_init_img_tokens ({n_init}) < image_seq_len ({N}) and img "
                             f"with batch {text.shape[0]} and at least that many tokens (got {tuple(prime.shape)})")
        return prime[:, :n_init]


def _module_product(linear: nn.Linear):
    """A product through the module's own weight (what TorchInductor sees and freezes), not an eager pack."""
    return lambda x: F.linear(x, linear.weight, linear.bias)


def _drop_dallepytorch_switches(fields: dict) -> None:
    """DALLE-pytorch's keywords without a setting here: accepted when they ask for what this model does anyway."""
    if fields.pop("reversible", False):
        raise ValueError("reversible=True (DALLE-pytorch's reversible layers: two residual streams) is not "
                         "implemented; drop it (transformer.gradient_checkpointing saves memory the same way)")
    if fields.pop("sparse_attn", False):
        raise ValueError("sparse_attn=True (DeepSpeed's block-sparse attention) is not supported: use attn_types "
                         "with axial_row / axial_col / conv_like")
    fields.pop("optimize_for_inference", None)  # axial attention is a mask here already: nothing to switch


def _init_weights(module: nn.Module):
    # GPT-2 style: small normal weights keep the initial logits near uniform, which makes the first steps stable.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
