"""Evaluating a trained Shapes DALLE: held-out losses (split into text and image parts) and the checker's scores of
images generated for captions the model never trained on.

Why a second text loss: the training loss_text averages over all text_seq_len positions, and every position after
a caption's end is a pad whose id is fully determined by the one before it (unique pad id per position), so it
costs nothing to predict. With captions of <= 12 tokens, text_seq_len 64 makes ~80 % of the averaged positions
free, so its loss_text looks several times lower than text_seq_len 16's without the model knowing more about
language. `loss_text_caption` averages only over the caption's own tokens plus the first pad (the model must
predict where the caption ends), which is comparable across text_seq_len.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from .objects import object_breakdown


@dataclass
class EvalSettings:
    n_val: int = 200  # validation captions (unseen captions, seen colour-shape pairs) to generate for
    n_heldout: int = 200  # held-out composition captions (colour-shape pairs never trained on)
    n_loss: int = 512  # samples per split for the held-out losses
    seed: int = 0  # which captions/images (the same for every run) and the sampling seed
    batch_size: int = 32
    # sampling: the model's own distribution (no top-k, temperature 1, no guidance). Comparing training objectives
    # should not depend on sampling tricks; and a short-trained model sampled with top-k 10 at temperature 0.7
    # collapses to its most likely token (the background patch), which hides what it learned about the caption
    top_k: int | None = None
    temperature: float = 1.0
    cond_scale: float = 1.0

    def to_dict(self) -> dict:
        return asdict(self)


def caption_token_mask(text: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the text targets that carry information, i.e. the caption's tokens and the first pad after it
    (where the caption ends). `text` holds raw ids with 0 = pad, captions left-aligned as the tokenizer writes them."""
    lengths = (text != 0).sum(dim=1, keepdim=True)
    positions = torch.arange(text.shape[1], device=text.device)[None, :]
    return (text != 0) | (positions == lengths)


@torch.no_grad()
def heldout_losses(model, vae, tokenizer, split: str, n: int, seed: int = 0, batch_size: int = 32) -> dict:
    """Mean loss_text (all positions, as trained), loss_text_caption (see module doc) and loss_img of `model` in
    eval mode on the first n items of ShapesDataset(split, seed). The same items for every model."""
    from dalle_lab.data.shapes import ShapesDataset

    cfg = model.config
    device = next(model.parameters()).device
    dataset = ShapesDataset(split=split, length=n, image_size=vae.image_size, seed=seed)
    was_training = model.training
    model.eval()
    sums = {"loss_text": 0.0, "loss_text_caption": 0.0, "loss_img": 0.0}
    caption_targets = 0
    try:
        for start in range(0, n, batch_size):
            images, captions = dataset.batch(range(start, min(n, start + batch_size)))
            text = tokenizer.tokenize(captions, cfg.text_seq_len).to(device)
            image_tokens = vae.get_codebook_indices(images.to(device))
            out = model(text, image_tokens, return_losses=True, return_logits=True)
            text_logits = out.logits[:, : cfg.text_seq_len, : cfg.total_text_tokens].float()
            # the targets as the model trains on them: pad at position i -> id num_text_tokens + i (see model/dalle.py)
            pad_ids = cfg.num_text_tokens + torch.arange(cfg.text_seq_len, device=device)
            text_ids = torch.where(text == 0, pad_ids[None, :], text)
            per_token = F.cross_entropy(text_logits.transpose(1, 2), text_ids, reduction="none")
            mask = caption_token_mask(text)
            rows = len(captions)
            sums["loss_text"] += float(out.loss_text) * rows
            sums["loss_img"] += float(out.loss_img) * rows
            sums["loss_text_caption"] += float(per_token[mask].sum())
            caption_targets += int(mask.sum())
    finally:
        model.train(was_training)
    return {"loss_text": sums["loss_text"] / n, "loss_img": sums["loss_img"] / n,
            "loss_text_caption": sums["loss_text_caption"] / caption_targets, "n": n}


@torch.no_grad()
def generation_scores(model, vae, tokenizer, captions, settings: EvalSettings) -> tuple[dict, torch.Tensor]:
    """Generate one image per caption and score it with the Shapes checker -> (evaluate()'s dict, images)."""
    from dalle_lab.data.checker import evaluate
    from dalle_lab.generate import GenerationConfig
    from dalle_lab.generate.folders import sample_images

    was_training = model.training
    model.eval()
    try:
        sampling = GenerationConfig(top_k=settings.top_k, temperature=settings.temperature,
                                    cond_scale=settings.cond_scale)
        images = sample_images(model, vae, tokenizer, captions, sampling, seed=settings.seed,
                               batch_size=settings.batch_size)
    finally:
        model.train(was_training)
    return evaluate(images, captions), images


def evaluate_model(model, vae, tokenizer, settings: EvalSettings) -> tuple[dict, dict]:
    """Everything the study records about one trained model -> (numbers, {split: generated images}).

    numbers[split]: the held-out losses, the checker's accuracy, exact_match and per_attribute, n_generated, and
    "objects": object_breakdown.object_breakdown's dict for the generated images (absent when a split has no
    captions)."""
    from dalle_lab.data.shapes import heldout_captions, validation_captions

    numbers, images = {}, {}
    for split, captions in (("val", validation_captions(settings.n_val, settings.seed)),
                            ("heldout", heldout_captions(settings.n_heldout, settings.seed))):
        losses = heldout_losses(model, vae, tokenizer, split, settings.n_loss, settings.seed, settings.batch_size)
        scores, generated = generation_scores(model, vae, tokenizer, captions, settings) if captions else ({}, None)
        numbers[split] = {**losses, **{k: scores[k] for k in ("accuracy", "exact_match", "per_attribute")
                                       if k in scores}, "n_generated": len(captions)}
        if captions:
            # which objects / caption positions the generations got right (issue 19, question (a)); it checks the
            # images again (~40 ms each on a CPU) rather than change generation_scores' return value
            numbers[split]["objects"] = object_breakdown(generated, captions)
        images[split] = generated
    return numbers, images


__all__ = ["EvalSettings", "caption_token_mask", "evaluate_model", "generation_scores", "heldout_losses"]
