"""One small adapter per package, so the measurement code in worker.py is identical for both.

An adapter builds a model from a neutral config dict and exposes: the training loss on (text, image token ids), one
generation call that returns token ids without decoding pixels, parameter counts, and the effective top-k its sampler
keeps for a given filter_thres. Our side follows docs/interfaces.md; the peer side is dalle-pytorch 1.6.6, imported
through peer_shims.py (run inside the peer's own environment only).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
from torch import nn

# The reference config: DALLE(dim=256, depth=4, heads=8, dim_head=32, num_text_tokens=1000, text_seq_len=32)
# over a 16x16 grid of a 512-entry codebook.
REFERENCE = dict(dim=256, depth=4, heads=8, dim_head=32, num_text_tokens=1000, text_seq_len=32,
                 num_image_tokens=512, image_fmap_size=16)
# Fields the peer takes from the image tokenizer instead of as keyword arguments.
_GRID_FIELDS = ("num_image_tokens", "image_fmap_size")
# Values dalle-pytorch 1.6.6 hard-codes instead of taking as DALLE arguments.
_PEER_FIXED = {"ff_mult": 4}


@dataclass
class Bench:
    impl: str
    model: nn.Module
    num_text_tokens: int
    text_seq_len: int
    num_image_tokens: int
    image_seq_len: int
    config: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    # filled by the builders below
    def loss(self, text, image_tokens):  # pragma: no cover - replaced per instance
        raise NotImplementedError

    def generate(self, text, use_cache: bool, filter_thres: float):  # pragma: no cover
        raise NotImplementedError

    def effective_k(self, filter_thres: float) -> int:  # pragma: no cover
        raise NotImplementedError

    def optimizer(self, params):  # pragma: no cover
        """The optimizer the package's own training script builds (the training measure steps it)."""
        raise NotImplementedError


def param_counts(model: nn.Module) -> dict:
    """Trainable parameters outside any image tokenizer, split into embedding tables and the rest.

    "Non-embedding" is what the MFU formula uses: token and position embedding tables are lookups, not matmuls; the
    output projection to logits is a matmul and is counted.
    """
    embedding_ids = set()
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) or "pos_emb" in name:
            embedding_ids.update(id(p) for p in module.parameters(recurse=True))
    total = embedding = 0
    for name, p in model.named_parameters():
        if name.startswith("vae.") or not p.requires_grad:
            continue
        total += p.numel()
        if id(p) in embedding_ids or "pos_emb" in name:
            embedding += p.numel()
    return dict(total=total, embedding=embedding, non_embedding=total - embedding)


# --------------------------------------------------------------------------------------------------------- ours

def build_ours(config: dict | None) -> Bench:
    """config None: DALLEConfig defaults (the main job's default model); else DALLEConfig defaults overridden."""
    from dataclasses import asdict

    from dalle_lab.model import DALLE, DALLEConfig

    cfg = DALLEConfig() if config is None else DALLEConfig(**config)
    model = DALLE.from_config(cfg)
    bench = Bench("ours", model, cfg.num_text_tokens, cfg.text_seq_len, cfg.num_image_tokens,
                  cfg.image_fmap_size ** 2, config=asdict(cfg))

    def loss(text, image_tokens):
        return model(text, image_tokens, return_loss=True)

    def generate(text, use_cache, filter_thres, decode="default"):
        # decode: "default" (generate_images with no strategy: what users get, the path the targets measure) or a
        # GenerationConfig strategy ("plain" is the cached module path the fast paths are tested against)
        return model.generate_images(text, filter_thres=filter_thres, use_cache=use_cache, return_tokens=True,
                                     strategy="auto" if decode == "default" else decode)

    def optimizer(params):
        from dalle_lab.training.engine import adamw

        return adamw(params, lr=1e-4)  # train_dalle.py's AdamW: the fused kernel where the parameters allow it

    bench.loss, bench.generate, bench.optimizer = loss, generate, optimizer
    bench.effective_k = lambda thres: _ours_effective_k(bench, thres)
    return bench


def _ours_effective_k(bench: Bench, filter_thres: float) -> int:
    """Count the image tokens our sampler leaves with non-zero probability for one row of random logits."""
    from dalle_lab.generate import sampling

    k = sampling.resolve_top_k(None, filter_thres, bench.num_image_tokens)
    log_probs = sampling.sampling_distribution(torch.randn(1, bench.num_image_tokens), top_k=k)
    return int(torch.isfinite(log_probs).sum())


# --------------------------------------------------------------------------------------------------------- peer

def peer_kwargs(config: dict, variant: str) -> tuple[dict, list]:
    """Map a neutral config onto dalle-pytorch's DALLE keyword arguments; return them and what could not be mapped."""
    from lab.perf import peer_shims

    dalle_pytorch = peer_shims.import_peer()
    accepted = set(inspect.signature(dalle_pytorch.DALLE.__init__).parameters) - {"self", "vae"}
    kwargs, unmapped = {}, []
    for key, value in config.items():
        if key in _GRID_FIELDS:
            continue
        if key in accepted:
            kwargs[key] = value
        elif key in _PEER_FIXED and _PEER_FIXED[key] == value:
            continue  # the peer hard-codes the same value
        else:
            unmapped.append(f"{key}={value!r}")
    if variant == "plain":  # like-with-like against a model without rotary embeddings or token shift
        kwargs.update(rotary_emb=False, shift_tokens=False)
    elif variant != "class-default":
        raise ValueError(f"unknown peer variant {variant!r}: use class-default or plain")
    return kwargs, unmapped


def _peer_grid_vae(dalle_pytorch, num_image_tokens: int, fmap: int):
    """A tiny DiscreteVAE whose only job is to tell the peer's DALLE the codebook size and the token grid side.

    The peer derives the grid from vae.image_size // 2 ** vae.num_layers and insists on a power-of-two image size at
    construction, so the attributes are set after construction; its weights are frozen and never run here.
    """
    vae = dalle_pytorch.DiscreteVAE(image_size=32, num_layers=1, num_tokens=num_image_tokens,
                                    codebook_dim=16, hidden_dim=8)
    vae.image_size, vae.num_layers = fmap * 2, 1
    vae.decode = lambda image_tokens: image_tokens  # generation returns token ids, like ours with return_tokens
    return vae


def build_peer(config: dict, variant: str = "class-default") -> Bench:
    from lab.perf import peer_shims

    dalle_pytorch = peer_shims.import_peer()
    kwargs, unmapped = peer_kwargs(config, variant)
    vae = _peer_grid_vae(dalle_pytorch, config["num_image_tokens"], config["image_fmap_size"])
    model = dalle_pytorch.DALLE(vae=vae, **kwargs)
    peer_shims.repair_cache(model)
    bench = Bench("peer", model, config["num_text_tokens"], config["text_seq_len"], config["num_image_tokens"],
                  config["image_fmap_size"] ** 2, config=dict(kwargs, variant=variant),
                  notes=[f"not in dalle-pytorch 1.6.6: {', '.join(unmapped)}"] if unmapped else [])

    def loss(text, image_tokens):
        return model(text, image_tokens, return_loss=True)

    def generate(text, use_cache, filter_thres, decode="default"):
        if decode != "default":
            raise ValueError(f"dalle-pytorch 1.6.6 has no {decode!r} decoding")
        return model.generate_images(text, filter_thres=filter_thres, use_cache=use_cache)

    def effective_k(filter_thres):
        # The peer filters over text + image logits (the text part is masked to -max first), so its k is a fraction
        # of num_text_tokens + text_seq_len + num_image_tokens, not of the image vocabulary.
        logits = torch.randn(1, model.total_tokens)
        logits[:, : model.num_text_tokens] = -torch.finfo(logits.dtype).max
        kept = dalle_pytorch.dalle_pytorch.top_k(logits, thres=filter_thres)
        return int(torch.isfinite(kept[:, model.num_text_tokens:]).sum())

    def optimizer(params):
        return torch.optim.Adam(params, lr=1e-4)  # what dalle-pytorch 1.6.6's train_dalle.py builds

    bench.loss, bench.generate, bench.effective_k, bench.optimizer = loss, generate, effective_k, optimizer
    return bench


def build(impl: str, config: dict | None, variant: str = "class-default") -> Bench:
    if impl == "ours":
        return build_ours(config)
    if impl == "peer":
        if config is None:
            raise ValueError("the peer needs an explicit config (run.py passes ours, resolved from DALLEConfig)")
        return build_peer(config, variant)
    raise ValueError(f"unknown implementation {impl!r}: use ours or peer")
