"""Evaluation inside an alignment run: every `eval_every` epochs (and before the first and after the last), fresh
samples for captions that are never RL prompts, drawn with generate.py's sampling, scored by the run's reward (each
term of a weighted sum separately) and, for Shapes captions, by the checker; beside them the three things that say
what the gain cost:

- `kl_ref_image`: KL to the starting model, nats per image (the exact per-token KL of the plain conditional
  distributions, summed over the image, at the evaluation samples' prefixes);
- `loss_img`: the image loss on real validation images (dalle_lab.evaluate.shapes.heldout_losses): forgetting;
- diversity among `eval_diversity_samples` samples of one caption: the fraction of distinct token sequences and the
  mean pairwise pixel distance (mean absolute difference in [0, 1]).

Samples come from a fixed seed per evaluation set, so successive evaluations differ by the model only.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from dalle_lab.align.config import to_dict
from dalle_lab.align.logprobs import token_kl
from dalle_lab.data.checker import check
from dalle_lab.data.shapes import is_shapes_caption
from dalle_lab.evaluate.shapes import heldout_losses
from dalle_lab.generate import generate
from dalle_lab.provenance import git_state
from dalle_lab.rewards.credit import concat_credit, score_with_credit
from dalle_lab.stats import mean_se
from dalle_lab.utils import atomic_write, cpu_has_native_bf16
from dalle_lab.vae.images import decode_images

EVAL_SEED = 4321  # sampling seed of the evaluations (kept apart from the run's seed: same captions, same noise)


def pixel_diversity(images: torch.Tensor, samples: int) -> float:
    """Mean over captions of the mean pairwise pixel distance among the `samples` consecutive images of each."""
    flat = images.float().flatten(1).reshape(-1, samples, images[0].numel())
    distance = (flat[:, :, None, :] - flat[:, None, :, :]).abs().mean(-1)  # (captions, samples, samples)
    return float(distance.sum(dim=(1, 2)).mean() / (samples * (samples - 1)))


def diversity(tokens: torch.Tensor, images: torch.Tensor) -> dict:
    """Distinct token sequences (fraction) and mean pairwise pixel distance among samples of one caption."""
    distinct = len({tuple(row.tolist()) for row in tokens}) / len(tokens)
    flat = images.float().flatten(1)
    distance = (flat[:, None, :] - flat[None, :, :]).abs().mean(-1)
    n = len(flat)
    pairwise = float(distance.sum() / (n * (n - 1))) if n > 1 else 0.0
    return {"diversity_distinct": distinct, "diversity_pixel": pairwise}


class TermRecorder:
    """Wraps a weighted-sum reward for the reward worker: returns the same total and keeps each term's scores, so a
    training epoch can log every term's mean (`reward_<term>`) without scoring twice."""

    def __init__(self, reward):
        self.reward, self.terms = reward, list(reward.terms)
        self._scores: dict[str, list[torch.Tensor]] = {}
        self._lock = threading.Lock()  # the worker thread records while the trainer may pop

    def _record(self, term, value) -> None:
        with self._lock:
            self._scores.setdefault(f"reward_{getattr(term, '__name__', 'term')}", []).append(
                torch.as_tensor(value).detach().float().cpu().reshape(-1))

    def __call__(self, images, prompts=None):
        total = None
        for term, weight in self.terms:
            value = torch.as_tensor(term(images, prompts)).float()
            self._record(term, value)
            total = weight * value if total is None else total + weight * value
        return total

    def credit(self, images, prompts, num_tokens: int):
        """The terms' credited scores side by side (dalle_lab.rewards.credit), each term's scores recorded."""
        items = []
        for term, weight in self.terms:
            credited = score_with_credit(term, images, prompts, num_tokens)
            self._record(term, credited.scores)
            items.append((credited, weight))
        return concat_credit(items)

    def pop_means(self) -> dict:
        with self._lock:
            scores, self._scores = self._scores, {}
        return {name: float(torch.cat(values).mean()) for name, values in scores.items()}


class RunEvaluator:
    """Scores a trainer's current model on fixed evaluation sets -> a flat dict of numbers (`eval_<set>_<name>`)."""

    def __init__(self, eval_sets: dict[str, list[str]], config):
        self.eval_sets = {name: list(prompts) for name, prompts in eval_sets.items() if prompts}
        self.config = config
        self.sampling = config.eval_sampling()

    @property
    def active(self) -> bool:
        return bool(self.eval_sets)

    @torch.no_grad()
    def sample(self, trainer, prompts, seed: int):
        """(text, tokens, images) of one sample per entry of `prompts`, from a generator seeded by `seed`."""
        dalle, s = trainer.dalle, self.sampling
        generator = torch.Generator(device=trainer.device).manual_seed(seed)
        tokens, texts = [], []
        for start in range(0, len(prompts), trainer.config.sample_batch_size):
            text = trainer.tokenize(prompts[start:start + trainer.config.sample_batch_size])
            tokens.append(generate(dalle, text, s, generator=generator)[0])
            texts.append(text)
        tokens, text = torch.cat(tokens), torch.cat(texts)
        return text, tokens, decode_images(dalle.vae, tokens).float().cpu()

    @torch.no_grad()
    def kl_per_image(self, trainer, text, tokens) -> np.ndarray:
        values = []
        for start in range(0, len(tokens), trainer.config.train_batch_size):
            t, k = text[start:start + trainer.config.train_batch_size], tokens[start:start + trainer.config.train_batch_size]
            policy = torch.log_softmax(trainer.dalle.logits(t, k).float(), -1)
            values.append(token_kl(policy, trainer.reference_logprobs(t, k)).sum(-1).cpu())
        return torch.cat(values).numpy()

    def score_set(self, trainer, name: str, captions: list[str], seed: int) -> dict:
        """Every caption sampled `eval_samples` times (consecutively), scored; `eval_<name>_<measure>`."""
        samples = self.config.eval_samples
        prompts = [caption for caption in captions for _ in range(samples)]
        text, tokens, images = self.sample(trainer, prompts, seed)
        out = {}
        reward = trainer.reward
        out["reward"], out["reward_se"] = mean_se(torch.as_tensor(reward(images, prompts)).float().cpu())
        for term, weight in getattr(reward, "terms", []):
            term_key = f"reward_{getattr(term, '__name__', 'term')}"
            out[term_key], out[f"{term_key}_se"] = mean_se(torch.as_tensor(term(images, prompts)).float().cpu())
        if all(is_shapes_caption(p) for p in prompts):  # the checker, image by image (standard errors)
            checks = [check(image, caption) for image, caption in zip(images, prompts)]
            out["accuracy"], out["accuracy_se"] = mean_se([c.accuracy for c in checks])
            out["exact_match"], out["exact_match_se"] = mean_se([float(c.exact) for c in checks])
        if trainer.reference is not None or trainer.lora_modules:
            out["kl_ref_image"] = float(self.kl_per_image(trainer, text, tokens).mean())
        if samples > 1:
            out["diversity_pixel"] = pixel_diversity(images, samples)
        return {f"eval_{name}_{key}": value for key, value in out.items()}

    def __call__(self, trainer) -> dict:
        start = time.perf_counter()
        result = {}
        for index, (name, prompts) in enumerate(self.eval_sets.items()):
            result.update(self.score_set(trainer, name, prompts, EVAL_SEED + index))
        cfg = self.config
        vae = trainer.dalle.vae
        if cfg.eval_loss_images and hasattr(vae, "get_codebook_indices"):
            losses = heldout_losses(trainer.dalle, vae, trainer.tokenizer, "val", cfg.eval_loss_images,
                                    batch_size=trainer.config.train_batch_size)
            result["eval_loss_img"] = losses["loss_img"]
        if cfg.eval_diversity_samples > 1:
            caption = next(iter(self.eval_sets.values()))[0]
            _, tokens, images = self.sample(trainer, [caption] * cfg.eval_diversity_samples, EVAL_SEED - 1)
            result.update({f"eval_{k}": v for k, v in diversity(tokens, images).items()})
        result["eval_s"] = round(time.perf_counter() - start, 2)
        return result


# ---------------------------------------------------------------- the run's results file

def write_results(path, trainer, argv: Sequence[str] | None, stop_reason: str, wall_s: float) -> Path:
    """results.json: what a reader needs to trust a number: command, config, commit, machine load, the evaluations
    before and after (and every one in between), and why the run stopped."""
    evals = trainer.eval_history
    record = {
        "command": None if argv is None else [sys.executable.rsplit("/", 1)[-1], "-m", "dalle_lab.align", *argv],
        "config": to_dict(trainer.config),
        "git": git_state(),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_end": os.getloadavg(),
        "epochs": trainer.epoch, "images_sampled": trainer.images_sampled,
        "train_s": round(trainer.elapsed_s, 2), "train_cpu_s": round(trainer.cpu_s, 2), "wall_s": round(wall_s, 2),
        "stop_reason": stop_reason,
        "cpu_native_bf16": cpu_has_native_bf16(),
        "load_average_start": trainer.load_average_start,
        "eval_sets": {name: len(prompts) for name, prompts in trainer.evaluator.eval_sets.items()},
        "eval_captions": trainer.evaluator.eval_sets,
        "rl_prompts": len(set(trainer.prompts)),
        "eval_sampling": vars(trainer.evaluator.sampling),
        "start": evals[0] if evals and evals[0]["epochs_done"] == 0 else None, "final": evals[-1] if evals else None,
        "evals": evals,
    }
    text = json.dumps(record, indent=1) + "\n"
    return atomic_write(Path(path), lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
