"""Train the small Shapes CLIP: `python -m dalle_lab.rewards.clip_train --out DIR` (defaults rebuild the shipped one).

    python -m dalle_lab.rewards.clip_train --out dalle_lab/assets/shapes_clip      # the shipped model
    python -m dalle_lab.rewards.clip_train --out /tmp/clip --steps 20 --batch_size 16 --vision_layers 1 ...

A ViT image tower and a text tower over the shipped BPE vocabulary (bpe/shapes.model), transformers' CLIPModel, trained
with CLIP's symmetric contrastive loss on the Shapes training split only; each image also meets one hard negative
caption (its own caption with one attribute changed, itself a training caption). Seeded and step-based, so the same
command on the same torch build and thread count gives the same weights. The directory it writes is a standard
transformers CLIP directory (see dalle_lab/rewards/clip.py); its zero-shot evaluation on validation and held-out
captions goes into its dalle_lab_clip.json and, with --results, into a results file.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F

from dalle_lab.provenance import git_commit, load_average, machine
from dalle_lab.rewards.clip import ClipArchitecture, ClipScorer, check_clip_output, new_clip, save_clip
from dalle_lab.rewards.clip import caption_ids, image_embeddings, text_embeddings, unit
from dalle_lab.rewards.clip_data import augment, evaluate_retrieval, training_batch
from dalle_lab.rewards.preprocess import CLIP_MEAN, CLIP_STD, clip_preprocess
from dalle_lab.tokenizers.loading import get_tokenizer
from dalle_lab.utils import atomic_write


@dataclass
class ClipTrainConfig:
    arch: ClipArchitecture = field(default_factory=ClipArchitecture)
    steps: int = 700
    batch_size: int = 128
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_steps: int = 60
    seed: int = 0
    hard_negatives: int = 1  # one-attribute-changed captions per image among the image's candidates
    augment: bool = True  # blur and noise, as a decoded VQGAN image has them
    # init scales, for experiments (docs/clip.md: neither taught the model where objects are in 250 steps):
    # position embeddings' std (None: transformers' 0.02), transformers' initializer_factor for the image tower
    position_init_std: float | None = None
    vision_init_factor: float = 1.0
    eval_pairs: int = 100
    threads: int = 1  # on a loaded 2-core machine one thread ran a step 4x faster than two

    def __post_init__(self):
        if isinstance(self.arch, dict):
            self.arch = ClipArchitecture(**self.arch)
        if self.hard_negatives < 0:
            raise ValueError(f"--hard_negatives must be >= 0, got {self.hard_negatives}")
        for name in ("steps", "batch_size", "eval_pairs", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.batch_size < 2:
            raise ValueError("--batch_size must be at least 2: the contrastive loss needs negatives in the batch")


def contrastive_loss(image, text, negatives, logit_scale, captions):
    """CLIP's symmetric cross-entropy on unit embeddings; pairs with the same caption are not each other's negatives.

    `negatives` (K*B, D) or None: extra captions each image must rank below its own (the text side is unchanged).
    """
    same = torch.tensor([[a == b for b in captions] for a in captions])
    same.fill_diagonal_(False)
    logits = logit_scale * image @ text.T  # (image, caption)
    logits = logits.masked_fill(same, float("-inf"))
    targets = torch.arange(len(captions))
    text_loss = F.cross_entropy(logits.T, targets)
    if negatives is not None:
        logits = torch.cat([logits, logit_scale * image @ negatives.T], dim=1)
    return (F.cross_entropy(logits, targets) + text_loss) / 2


def _learning_rate(config: ClipTrainConfig, step: int) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * 0.5 * (1 + math.cos(math.pi * progress))


def train_clip(config: ClipTrainConfig, bpe_path=None, log=print):
    """Train; returns (ClipScorer on the trained model, history list of dicts)."""
    torch.manual_seed(config.seed)
    tokenizer = get_tokenizer(bpe_path)
    arch = config.arch
    model = new_clip(arch, tokenizer.vocab_size, seed=config.seed, vision_init_factor=config.vision_init_factor)
    if config.position_init_std is not None:
        with torch.no_grad():
            position = model.vision_model.embeddings.position_embedding.weight
            position.normal_(0.0, config.position_init_std, generator=torch.Generator().manual_seed(config.seed))
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embedding" not in n]
    keep = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embedding" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": keep, "weight_decay": 0.0}], lr=config.lr, betas=(0.9, 0.98), eps=1e-6)
    generator = torch.Generator().manual_seed(config.seed)
    history, start = [], time.time()
    for step in range(config.steps):
        images, captions, negatives = training_batch(step, config.batch_size, config.seed, arch.image_size,
                                                     config.hard_negatives)
        if config.augment:
            images = augment(images, generator)
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(config, step)
        texts = captions + (negatives or [])
        ids, mask = caption_ids(tokenizer, texts, arch.context_length)
        _, image = image_embeddings(model, clip_preprocess(images, arch.image_size, CLIP_MEAN, CLIP_STD))
        text = unit(text_embeddings(model, ids, mask))
        image = unit(image)
        batch = len(captions)
        loss = contrastive_loss(image, text[:batch], text[batch:] if negatives else None,
                                model.logit_scale.exp(), captions)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        with torch.no_grad():  # CLIP's cap on the temperature: logits at most 100 x cosine
            model.logit_scale.clamp_(0, math.log(100))
        if step % 50 == 0 or step == config.steps - 1:
            loss_value, scale = float(loss.detach()), float(model.logit_scale.detach().exp())
            history.append({"step": step, "loss": round(loss_value, 4), "logit_scale": round(scale, 2),
                            "elapsed_s": round(time.time() - start, 1)})
            log(f"[clip_train] step {step}/{config.steps} loss {loss_value:.4f} scale {scale:.1f} "
                f"{time.time() - start:.0f}s")
    model.eval().requires_grad_(False)
    scorer = ClipScorer(model=model, tokenizer=tokenizer, context_length=arch.context_length)
    return scorer, history


def evaluate(scorer, pairs: int = 100) -> dict:
    """Retrieval and attribute tests on validation and held-out captions (dalle_lab.rewards.clip_data)."""
    return {split: evaluate_retrieval(scorer, split, pairs) for split in ("val", "heldout")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dalle_lab.rewards.clip_train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output CLIP directory (replaced atomically)")
    parser.add_argument("--bpe_path", default=None, help="text vocabulary (default: the shipped bpe/shapes.model)")
    parser.add_argument("--results", default=None, help="also write a results JSON here (command, commit, load)")
    defaults = ClipTrainConfig()
    for f in fields(ClipArchitecture):
        parser.add_argument(f"--{f.name}", type=int, default=getattr(defaults.arch, f.name))
    for f in fields(ClipTrainConfig):
        if f.name == "arch":
            continue
        value = getattr(defaults, f.name)
        if isinstance(value, bool):
            parser.add_argument(f"--{f.name}", type=lambda text: text.lower() in ("1", "true", "yes"), default=value,
                                metavar="{true,false}")
        else:
            parser.add_argument(f"--{f.name}", type=float if value is None else type(value), default=value)
    return parser


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        arch = ClipArchitecture(**{f.name: getattr(args, f.name) for f in fields(ClipArchitecture)})
        config = ClipTrainConfig(arch=arch, **{f.name: getattr(args, f.name) for f in fields(ClipTrainConfig)
                                               if f.name != "arch"})
    except ValueError as error:
        parser.error(str(error))
    torch.set_num_threads(config.threads)
    load_before = load_average()
    try:
        check_clip_output(args.out)  # before ten minutes of training, not after
        scorer, history = train_clip(config, args.bpe_path, log=lambda line: print(line, file=sys.stderr))
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"python -m dalle_lab.rewards.clip_train: error: {error}")
    train_seconds = history[-1]["elapsed_s"]
    evaluation = evaluate(scorer, config.eval_pairs)
    trained = {"config": asdict(config), "evaluation": evaluation, "history": history,
               "command": "python -m dalle_lab.rewards.clip_train " + " ".join(argv if argv is not None else sys.argv[1:])}
    save_clip(scorer.model, scorer.tokenizer, config.arch, args.out, extra={"training": trained})
    summary = {split: {k: v for k, v in result.items() if k in ("caption_to_image_top1", "image_to_caption_top1",
                                                                  "attribute_test")}
               for split, result in evaluation.items()}
    print(json.dumps(summary, indent=1))
    if args.results:
        results = {**trained, "git_commit": git_commit(), "train_seconds": train_seconds,
                   "loadavg_before": load_before, "loadavg_after": load_average(), "machine": machine(), "torch": torch.__version__,
                   "threads": config.threads, "out": str(args.out),
                   "parameters": sum(p.numel() for p in scorer.model.parameters())}
        atomic_write(args.results, lambda tmp: Path(tmp).write_text(json.dumps(results, indent=1) + "\n"))
    print(f"[clip_train] wrote {args.out} ({train_seconds:.0f}s of training)", file=sys.stderr)
    return trained


if __name__ == "__main__":
    main()
