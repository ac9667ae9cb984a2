"""Reward backpropagation (AlignProp-style) for differentiable rewards, through a straight-through Gumbel-softmax.

AlignProp backpropagates a differentiable reward through the whole sampling chain into the generator, truncating
the gradient to the last K denoising steps to bound cost. The autoregressive analogue here:

1. sample image tokens as usual (no gradient, KV cache, the configured sampling distribution);
2. recompute the logits of every position in one teacher-forced pass with gradients, and for the last K positions
   build straight-through Gumbel-softmax relaxations of the tokens that were actually sampled: Gumbel noise is drawn
   *conditioned on* the sampled token being the argmax (the top-down construction of Maddison et al.), so the
   forward value is exactly the sampled one-hot and the backward pass sees softmax((log p + g) / tau);
3. decode the (one-hot valued, differentiable) token distributions through the frozen VQGAN decoder
   (`vae.decode_soft`), score with the differentiable reward and step on -reward (+ the per-token KL penalty).

Positions before the last K enter as constant one-hots: the gradient reaches the transformer only through the last
K tokens' logits (a test checks it). Earlier tokens still shape the image; they just are not credited. Cost stays
one forward + backward of the transformer and the decoder per batch whatever K is, because the relaxation is
applied to recomputed logits rather than unrolled through the sampler.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from dalle_lab.align.policy_gradient import policy_logprobs, token_entropy, token_kl
from dalle_lab.rewards import is_differentiable
from dalle_lab.align.trainer import AlignTrainer, chunks


def conditional_gumbel(logprobs, tokens, generator: torch.Generator | None = None):
    """Perturbed log-probs z = log p + g with g ~ Gumbel, drawn conditionally on argmax z == tokens.

    logprobs: (..., V) normalised log-probs (entries of -inf allowed: they stay -inf); tokens: (...) long.
    Top-down sampling: the maximum of log p + Gumbel is itself Gumbel-distributed with location logsumexp(log p) = 0;
    every other entry is an independent Gumbel truncated below that maximum.
    """
    logprobs = logprobs.detach().float()

    def gumbel(shape):
        uniform = torch.rand(shape, generator=generator, device="cpu").clamp_(1e-10, 1.0 - 1e-7)
        return (-torch.log(-torch.log(uniform))).to(logprobs.device)

    top = gumbel(tokens.shape).unsqueeze(-1)  # the maximum, location 0 because logprobs are normalised
    free = logprobs + gumbel(logprobs.shape)
    truncated = -torch.logaddexp(-top, -free)  # Gumbel(free) truncated to lie below `top`
    return truncated.scatter(-1, tokens.unsqueeze(-1), top)


def straight_through_tokens(logprobs, tokens, last_k: int, tau: float = 1.0,
                            generator: torch.Generator | None = None):
    """(B, N, V) token distributions whose forward value is one_hot(tokens) everywhere, and whose gradient flows into
    `logprobs` only at the last `last_k` positions (straight-through Gumbel-softmax there, constants elsewhere)."""
    num_positions = tokens.shape[1]
    last_k = max(0, min(int(last_k), num_positions))
    hard = F.one_hot(tokens, logprobs.shape[-1]).to(logprobs.dtype)
    if last_k == 0:
        return hard
    start = num_positions - last_k
    tail_logprobs = logprobs[:, start:]
    perturbed = conditional_gumbel(tail_logprobs, tokens[:, start:], generator)
    noise = torch.where(torch.isfinite(tail_logprobs.detach()), perturbed - tail_logprobs.detach(),
                        torch.zeros_like(perturbed))
    soft = torch.softmax((tail_logprobs + noise) / tau, dim=-1)
    tail = hard[:, start:] + soft - soft.detach()
    return torch.cat([hard[:, :start], tail], dim=1)


class RewardBackpropTrainer(AlignTrainer):
    """One gradient step per sampled batch on -reward(decode_soft(relaxed tokens)); see the module docstring."""

    needs_reference = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not is_differentiable(self.reward):
            raise ValueError(f"reward backpropagation needs a differentiable reward; {self.config.reward!r} is not "
                             "(JPEG size and the Shapes checker are not differentiable). Use "
                             "negative_total_variation (a compressibility proxy), brightness or aesthetic, or "
                             "--method policy_gradient")
        if not hasattr(self.dalle.vae, "decode_soft"):
            raise ValueError("reward backpropagation needs an image tokenizer with decode_soft(probs)")

    def backprop_loss(self, text, tokens, prompts):
        """Loss, rewards (detached) and stats for one sampled batch."""
        cfg = self.config
        sampled, processed, model_full = policy_logprobs(self.dalle, text, tokens, cfg)
        relaxed = straight_through_tokens(processed, tokens, cfg.backprop_last_k, cfg.gumbel_tau, self.generator)
        images = self.dalle.vae.decode_soft(relaxed)
        rewards = self.reward(images, prompts)
        loss = -rewards.mean()
        stats = {"entropy": token_entropy(processed.detach()).mean().item()}
        if self.has_reference:
            start = tokens.shape[1] - max(0, min(cfg.backprop_last_k, tokens.shape[1]))
            reference = self.reference_logprobs(text, tokens)
            kl_tail = token_kl(model_full[:, start:], reference[:, start:])
            with torch.no_grad():
                stats["kl_ref_token"] = token_kl(model_full, reference).mean().item()
            if kl_tail.numel():
                loss = loss + self.kl.coef * kl_tail.mean()
        return loss, rewards.detach(), images.detach(), stats

    def train_epoch(self, prompts: list[str]) -> dict:
        cfg = self.config
        rewards, images_all, logs = [], [], []
        for batch_prompts in chunks(prompts, cfg.train_batch_size):
            text = self.tokenize(batch_prompts)
            _, tokens, _ = self.sample(text)
            loss, batch_rewards, images, stats = self.backprop_loss(text, tokens, batch_prompts)
            stats["grad_norm"] = self.step(loss)
            stats["loss"] = loss.item()
            rewards.append(batch_rewards.float().cpu().reshape(-1))
            images_all.append(images.cpu())
            logs.append(stats)
        log = {k: float(np.mean([s[k] for s in logs])) for k in logs[0]}
        if "kl_ref_token" in log:
            log["kl_ref_image"] = log["kl_ref_token"] * tokens.shape[1]
        rewards = torch.cat(rewards)
        log.update(self.reward_summary(rewards))
        log.update(self.reward_precision_gap(torch.cat(images_all), prompts, rewards))
        return log
