"""Measuring a (fine-tuned) model on fresh samples: reward mean and standard error, Shapes checker accuracy and
exact match, and the KL to a reference model. Used by lab/studies/align/targets.py and docs/align.md's numbers."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch

from dalle_lab.align.config import AlignConfig
from dalle_lab.align.logprobs import policy_logprobs, token_kl
from dalle_lab.data.checker import check
from dalle_lab.generate import generate
from dalle_lab.stats import mean_se
from dalle_lab.vae.images import decode_images


@torch.no_grad()
def sample_images(dalle, tokenizer, prompts: Sequence[str], config: AlignConfig, batch_size: int = 32,
                  seed: int = 0):
    """(images, tokens, text) for each prompt, from a fixed seed (the global RNG is left as it was)."""
    images, tokens, texts = [], [], []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(prompts), batch_size):
            text = tokenizer.tokenize(list(prompts[start:start + batch_size]), dalle.config.text_seq_len)
            text = text.to(next(dalle.parameters()).device)
            batch_tokens, _ = generate(dalle, text, config.generation())
            images.append(decode_images(dalle.vae, batch_tokens).cpu())
            tokens.append(batch_tokens)
            texts.append(text)
    return torch.cat(images), torch.cat(tokens), torch.cat(texts)


@torch.no_grad()
def sequence_kl(policy, reference, text, tokens, config: AlignConfig, batch_size: int = 32,
                reference_context=None) -> np.ndarray:
    """Per image: the sum over its tokens of the exact per-token KL(policy || reference) of the models' plain
    conditional distributions, at prefixes sampled from the policy (an unbiased estimate of the sequence KL).
    `reference_context`: a context manager factory that turns `policy` into the reference (LoRA adapters off)."""
    values = []
    for start in range(0, len(tokens), batch_size):
        t, k = text[start:start + batch_size], tokens[start:start + batch_size]
        _, _, policy_full = policy_logprobs(policy, t, k, config)
        if reference_context is not None:
            with reference_context():
                ref_logits = policy.logits(t, k)
        else:
            ref_logits = reference.logits(t, k)
        values.append(token_kl(policy_full, torch.log_softmax(ref_logits.float(), -1)).sum(-1).cpu())
    return torch.cat(values).numpy()


def evaluate_model(dalle, tokenizer, prompts: Sequence[str], reward: Callable, config: AlignConfig,
                   seed: int = 0, reference=None, reference_context=None, shapes: bool = True,
                   batch_size: int = 32) -> dict:
    """Sample one image per entry of `prompts` (repeat a prompt to get several) and measure it.

    Returns reward_mean / reward_se, and with `shapes` the checker's mean attribute accuracy and exact-match rate
    (with standard errors), and with a reference the mean sequence KL to it."""
    images, tokens, text = sample_images(dalle, tokenizer, prompts, config, batch_size, seed)
    rewards = torch.as_tensor(reward(images, list(prompts))).detach().float().cpu().numpy()
    result = {"n": len(prompts)}
    result["reward_mean"], result["reward_se"] = mean_se(rewards)
    if shapes:
        checks = [check(image, caption) for image, caption in zip(images, prompts)]
        result["checker_accuracy"], result["checker_accuracy_se"] = mean_se([c.accuracy for c in checks])
        result["exact_match"], result["exact_match_se"] = mean_se([float(c.exact) for c in checks])
    if reference is not None or reference_context is not None:
        kl = sequence_kl(dalle, reference, text, tokens, config, batch_size, reference_context)
        result["kl_ref_image"], result["kl_ref_image_se"] = mean_se(kl)
    result["images"] = images
    return result


def improvement_in_se(before: dict, after: dict, key: str = "reward_mean") -> float:
    """(after - before) in units of the standard error of that difference (two independent samples)."""
    se_key = key.replace("_mean", "") + "_se" if key.endswith("_mean") else key + "_se"
    difference = after[key] - before[key]
    se = math.sqrt(before[se_key] ** 2 + after[se_key] ** 2)
    if se == 0:  # both samples constant (e.g. no exact match before or after)
        return 0.0 if difference == 0 else math.copysign(math.inf, difference)
    return difference / se
