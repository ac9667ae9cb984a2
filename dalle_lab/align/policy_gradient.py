"""Token-level policy-gradient fine-tuning (PPO with per-token ratios, as DDPO does per denoising step).

The policy is the DALLE transformer; an action is one sampled image token; a trajectory is the image's token
sequence; the reward arrives once, after decoding. Per epoch:

1. for each prompt sample a group of images, recording each token's log-probability under the exact distribution
   that sampled it (temperature, top-k / top-p and guidance applied: dalle_lab.sampling is the one place that
   defines that distribution, and both the sampler and `policy_logprobs` below go through it);
2. score the images (in a background thread, overlapping with sampling the next batch) and turn rewards into
   advantages normalised per prompt (DDPO's tracker or GRPO's groups), clipped;
3. several inner epochs of minibatch updates on the PPO clipped objective over per-token ratios
   pi_new(token) / pi_old(token), every token of an image sharing that image's advantage, plus a per-token KL
   penalty to the frozen starting model; gradient clipping.

The model is kept in eval mode (dropout off) throughout, so recomputed log-probs equal the recorded ones exactly
before the first update and ratios start at 1 (a test checks it).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from dalle_lab.align.stat_tracking import PerPromptStatTracker, clip_advantages, group_normalize
from dalle_lab.align.trainer import AlignTrainer, chunks

LOG_RATIO_LIMIT = 20.0  # exp(20) ~ 5e8: keeps a ratio finite when a token fell out of a filtered (top-k/p) support


# ---------------------------------------------------------------- the pieces of the objective (pure functions)

def ppo_clipped_loss(new_logprobs, old_logprobs, advantages, clip_range: float):
    """PPO's clipped surrogate on per-token ratios.

    new_logprobs, old_logprobs: (B, N) log-probs of the sampled tokens now and when sampled.
    advantages: (B,) one per image, shared by all its tokens.
    Returns (loss, stats) where stats holds detached `approx_kl` (0.5 * mean squared log-ratio, as DDPO logs) and
    `clipfrac` (fraction of tokens whose ratio left [1 - clip, 1 + clip]).
    """
    log_ratio = (new_logprobs - old_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    adv = advantages.reshape(-1, 1).to(ratio.dtype)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    loss = torch.maximum(unclipped, clipped).mean()
    with torch.no_grad():
        stats = {
            "approx_kl": 0.5 * (log_ratio ** 2).mean().item(),
            "clipfrac": ((ratio - 1.0).abs() > clip_range).float().mean().item(),
        }
    return loss, stats


def token_kl(policy_logprobs_full, reference_logprobs_full):
    """Exact per-token KL(policy || reference) over the whole image vocabulary: (B, N, V) log-probs -> (B, N).

    Zero when the two are the same distribution. The KL is taken between the models' own (unfiltered, temperature
    1, unguided) next-token distributions: filtered supports would make it infinite, and "stay close to what the
    starting model believes" is the regulariser we want, whatever sampling settings are used.
    """
    p = policy_logprobs_full.exp()
    return (p * (policy_logprobs_full - reference_logprobs_full)).sum(-1)


def token_entropy(logprobs_full):
    """Per-token entropy (nats) of a (B, N, V) log-prob tensor; filtered (-inf) entries contribute 0."""
    p = logprobs_full.exp()
    return -(p * torch.where(p > 0, logprobs_full, torch.zeros_like(logprobs_full))).sum(-1)


# ---------------------------------------------------------------- log-probs under the sampling distribution

def policy_logprobs(dalle, text, tokens, config):
    """Recompute what the sampler did, with gradients: log-probs of `tokens` under the sampling distribution.

    Returns (sampled_logprobs (B, N), sampling_logprobs_full (B, N, V), model_logprobs_full (B, N, V)); the last is
    the plain conditional distribution the KL penalty uses.
    """
    from dalle_lab import sampling

    cond = dalle.logits(text, tokens)
    null = dalle.logits(dalle.null_text(text), tokens) if config.cond_scale != 1.0 else None
    top_k = sampling.resolve_top_k(config.top_k, None, cond.shape[-1])
    processed = sampling.sampling_distribution(cond, null, cond_scale=config.cond_scale,
                                               temperature=config.temperature, top_k=top_k, top_p=config.top_p)
    sampled = processed.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return sampled, processed, F.log_softmax(cond.float(), dim=-1)


# ---------------------------------------------------------------- the trainer

class PolicyGradientTrainer(AlignTrainer):
    """PPO over image tokens. See the module docstring for the algorithm; AlignTrainer holds the run machinery
    (reference model, LoRA, optimiser, checkpoints that resume, logs, plots, sample grids)."""

    needs_reference = True

    def _build_extra_state(self):
        cfg = self.config
        self.tracker = PerPromptStatTracker(cfg.stat_buffer_size, cfg.stat_min_count)

    def extra_state_dict(self) -> dict:
        return {"tracker": self.tracker.state_dict()}

    def load_extra_state(self, state: dict) -> None:
        self.tracker.load_state_dict(state["tracker"])

    @torch.no_grad()
    def collect(self, prompts: list[str]) -> dict:
        """Sample images for `prompts` with recorded log-probs; rewards computed in the background."""
        cfg = self.config
        batches, futures = [], []
        for batch_prompts in chunks(prompts, cfg.sample_batch_size):
            text = self.tokenize(batch_prompts)
            images, tokens, logprobs = self.sample(text)
            futures.append(self.reward_worker.submit(images, batch_prompts))
            reference = self.reference_logprobs(text, tokens) if self.has_reference else torch.zeros(0)
            batches.append((text, tokens, logprobs, reference, images))
        rewards = torch.cat([future.result().float().cpu().reshape(-1) for future in futures])
        text, tokens, old_logprobs, ref_logprobs, images = (torch.cat(parts) for parts in zip(*batches))
        return {"prompts": prompts, "text": text, "tokens": tokens, "old_logprobs": old_logprobs,
                "ref_logprobs": ref_logprobs, "images": images, "rewards": rewards}

    def advantages(self, prompts, rewards) -> torch.Tensor:
        cfg = self.config
        if cfg.advantage == "group":
            adv = group_normalize(prompts, rewards.numpy())
        else:
            adv = self.tracker.update(prompts, rewards.numpy())
        return torch.as_tensor(clip_advantages(adv, cfg.adv_clip_max), dtype=torch.float32)

    def train_epoch(self, prompts: list[str]) -> dict:
        cfg = self.config
        batch = self.collect(prompts)
        advantages = self.advantages(prompts, batch["rewards"])
        n = len(prompts)
        sums: dict[str, list[float]] = {"loss": [], "approx_kl": [], "clipfrac": [], "kl_ref_token": [],
                                        "entropy": [], "grad_norm": [], "ratio_first": []}
        for inner in range(cfg.inner_epochs):
            order = torch.randperm(n, generator=self.generator)
            for index in chunks(order, cfg.train_batch_size):
                sampled, processed, model_full = policy_logprobs(
                    self.dalle, batch["text"][index], batch["tokens"][index], cfg)
                pg_loss, stats = ppo_clipped_loss(sampled, batch["old_logprobs"][index], advantages[index],
                                                  cfg.clip_range)
                loss = pg_loss
                if self.has_reference:
                    kl = token_kl(model_full, batch["ref_logprobs"][index]).mean()
                    loss = loss + self.kl.coef * kl  # fixed or adaptive (kl_control)
                    sums["kl_ref_token"].append(kl.item())
                grad_norm = self.step(loss)
                sums["loss"].append(loss.item())
                sums["approx_kl"].append(stats["approx_kl"])
                sums["clipfrac"].append(stats["clipfrac"])
                sums["entropy"].append(token_entropy(processed.detach()).mean().item())
                sums["grad_norm"].append(grad_norm)
                if inner == 0 and not sums["ratio_first"]:  # before any update: must be 0 (ratio 1)
                    sums["ratio_first"].append((sampled.detach() - batch["old_logprobs"][index]).abs().max().item())
        rewards = batch["rewards"]
        log = {k: float(np.mean(v)) for k, v in sums.items() if v}
        log["max_abs_logratio_first_step"] = log.pop("ratio_first")
        if "kl_ref_token" in log:  # the sequence KL: per-token KL summed over the image's tokens
            log["kl_ref_image"] = log["kl_ref_token"] * batch["tokens"].shape[1]
        log.update(self.reward_summary(rewards))
        log.update(self.reward_precision_gap(batch["images"], prompts, rewards))
        return log
