"""Token-level policy-gradient fine-tuning (PPO with per-token ratios, as DDPO does per denoising step).

The policy is the DALLE transformer; an action is one sampled image token; a trajectory is the image's token
sequence; the reward arrives once, after decoding. Per epoch:

1. for each prompt sample a group of images, recording each token's log-probability under the exact distribution
   that sampled it (temperature, top-k / top-p and guidance applied: dalle_lab.generate.sampling is the one place that
   defines that distribution, and both the sampler and `policy_logprobs` below go through it);
2. score the images (in a background thread, overlapping with sampling the next batch) and turn rewards into
   advantages normalised per prompt (DDPO's tracker, or GRPO's groups over the group's or the batch's std), clipped,
   and credited to the image's tokens (credit.py: all of them, or where the reward's credit map points);
3. several inner epochs of minibatch updates on the PPO clipped objective over per-token ratios
   pi_new(token) / pi_old(token), each token with its advantage, plus a per-token KL penalty to the frozen starting
   model; gradient clipping. Groups whose rewards have no spread can be left out (drop_flat_groups).

The model is kept in eval mode (dropout off) throughout, so recomputed log-probs equal the recorded ones exactly
before the first update and ratios start at 1 (a test checks it).
"""
from __future__ import annotations

from functools import partial

import numpy as np
import torch

from dalle_lab.align.credit import credited_scores, image_advantages_as_tokens, token_advantages
from dalle_lab.align.diversity_bonus import scoring_with_bonus
from dalle_lab.align.logprobs import token_entropy, token_kl  # noqa: F401  (token_kl: re-exported)
from dalle_lab.align.logprobs import policy_logprobs, uses_filter  # policy_logprobs: also re-exported
from dalle_lab.align.stat_tracking import PerPromptStatTracker, clip_advantages, flat_groups
from dalle_lab.align.trainer import AlignTrainer, chunks
from dalle_lab.rewards.credit import CreditedScores
from dalle_lab.seeding import seeded_generator
from dalle_lab.vae.images import decode_images

LOG_RATIO_LIMIT = 20.0  # exp(20) ~ 5e8: keeps a ratio finite when a token fell out of a filtered (top-k/p) support


# ---------------------------------------------------------------- the pieces of the objective (pure functions)

def ppo_clipped_loss(new_logprobs, old_logprobs, advantages, clip_range: float):
    """PPO's clipped surrogate on per-token ratios, averaged over tokens.

    new_logprobs, old_logprobs: (B, N) log-probs of the sampled tokens now and when sampled.
    advantages: (B, N), each token's own (credit.py), or (B,), one per image shared by all its tokens.
    Returns (loss, stats) where stats holds detached `approx_kl` (0.5 * mean squared log-ratio, as DDPO logs) and
    `clipfrac` (fraction of tokens whose ratio left [1 - clip, 1 + clip]).
    """
    raw_log_ratio = new_logprobs - old_logprobs
    log_ratio = raw_log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    adv = advantages.to(ratio.dtype)
    adv = adv if adv.dim() == 2 else adv.reshape(-1, 1)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    loss = torch.maximum(unclipped, clipped).mean()
    with torch.no_grad():
        stats = {
            "approx_kl": 0.5 * (log_ratio ** 2).mean().item(),
            "clipfrac": ((ratio - 1.0).abs() > clip_range).float().mean().item(),
            # tokens whose ratio hit the e^+-20 clamp (they contribute no gradient): 0 unless something is off
            "clamped_tokens": int((raw_log_ratio.abs() >= LOG_RATIO_LIMIT).sum()),
        }
    return loss, stats


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

    def scoring_function(self):
        """The reward worker returns CreditedScores: scores, their parts and the parts' token maps (credit.py)."""
        cfg = self.config
        if cfg.diversity_weight and cfg.sample_batch_size % cfg.group_size:
            self.log_fn(f"[align] note: sample_batch_size {cfg.sample_batch_size} splits groups of {cfg.group_size}: "
                        "the diversity bonus compares the best samples within each batch's part of a group (a "
                        "multiple of group_size compares whole groups)")
        scoring = partial(credited_scores, self.term_recorder or self.reward,
                          num_tokens=self.dalle.config.image_seq_len, kind=self.config.credit)
        return partial(scoring_with_bonus, scoring=scoring, weight=self.config.diversity_weight)

    @torch.no_grad()
    def collect(self, prompts: list[str]) -> dict:
        """Sample images for `prompts` (this process's chunks), recording each token's log-prob and the sampler's
        support; score them in the background; gather every process's trajectories into the global epoch.
        `images` holds this process's images only (for the reward-precision gap)."""
        rows, futures, images_local, prompts_local, index = [], [], [], [], []
        for chunk, part in self.sample_chunks(len(prompts)):
            batch_prompts = prompts[part]
            text = self.tokenize(batch_prompts)
            tokens, logprobs, support = self.sample_tokens(text, self.chunk_generator(self.epoch, chunk))
            images = decode_images(self.dalle.vae, tokens)
            futures.append(self.reward_worker.submit(images, batch_prompts))
            row = {"text": text, "tokens": tokens, "old_logprobs": logprobs}
            if support is not None:
                row["support"] = support
            rows.append(row)
            images_local.append(images)
            prompts_local += batch_prompts
            index.append(torch.arange(part.start, part.stop))
        credited = [future.result() for future in futures]
        # the reward's number of parts, from a process that scored something (a collective: every process asks)
        parts = max(self.processes.gather_objects(credited[0].parts.shape[1] if credited else 0))
        local = {k: torch.cat([r[k] for r in rows]) for k in rows[0]} if rows else self._empty_rows(parts)
        for name, field in (("rewards", "scores"), ("reward_parts", "parts"), ("credit_maps", "maps")):
            if credited:
                local[name] = torch.cat([getattr(c, field).float().cpu() for c in credited])
        index = torch.cat(index) if index else torch.zeros(0, dtype=torch.long)
        batch = self.gather_rows(local, index)
        batch.update(prompts=prompts, images=torch.cat(images_local) if images_local else None,
                     local_prompts=prompts_local, local_rewards=local["rewards"])
        return batch

    def _empty_rows(self, parts: int) -> dict:
        """No chunk for this process (more processes than chunks): zero rows of the right shapes."""
        cfg, dcfg = self.config, self.dalle.config
        rows = {"text": torch.zeros(0, dcfg.text_seq_len, dtype=torch.long, device=self.device),
                "tokens": torch.zeros(0, dcfg.image_seq_len, dtype=torch.long, device=self.device),
                "old_logprobs": torch.zeros(0, dcfg.image_seq_len, device=self.device),
                "rewards": torch.zeros(0), "reward_parts": torch.zeros(0, parts),
                "credit_maps": torch.zeros(0, parts, dcfg.image_seq_len)}
        if uses_filter(cfg):
            rows["support"] = torch.zeros(0, dcfg.image_seq_len, (dcfg.num_image_tokens + 7) // 8,
                                          dtype=torch.uint8, device=self.device)
        return rows

    def advantages(self, prompts, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """((B, N) advantages of every token, (B,) bool: the sample's group had any spread)."""
        cfg = self.config
        if cfg.advantage == "group":
            credited = CreditedScores(batch["rewards"], batch["reward_parts"], batch["credit_maps"])
            return token_advantages(prompts, credited, cfg.adv_std, cfg.adv_clip_max)
        rewards = batch["rewards"].numpy()
        adv = clip_advantages(self.tracker.update(prompts, rewards), cfg.adv_clip_max)
        informative = torch.from_numpy(~flat_groups(prompts, rewards))
        return image_advantages_as_tokens(adv, self.dalle.config.image_seq_len), informative

    def micro_batch_loss(self, batch, advantages, index, share: float, first_pass: bool) -> tuple:
        """The loss of one micro-batch, scaled by its share of the optimizer step's samples (so the sum over the
        step's micro-batches and processes is the step's mean), and its statistics (sums over its samples)."""
        cfg = self.config
        text, tokens = batch["text"][index], batch["tokens"][index]
        support = batch["support"][index] if "support" in batch else None
        sampled, processed, model_full, flips = policy_logprobs(self.dalle, text, tokens, cfg, support,
                                                                return_flips=True)
        old = batch["old_logprobs"][index]
        pg_loss, stats = ppo_clipped_loss(sampled, old, advantages[index].to(sampled.device), cfg.clip_range)
        loss = pg_loss
        n = len(index)
        sums = {"images": n, "approx_kl": stats["approx_kl"] * n, "clipfrac": stats["clipfrac"] * n,
                "clamped_tokens": stats["clamped_tokens"],
                "entropy": token_entropy(processed.detach()).mean().item() * n}
        if first_pass:
            sums["support_flips"] = flips
        if self.has_reference:
            reference = self.kl_reference_logprobs(text, tokens, support)
            kl = token_kl(self.kl_policy_logprobs(processed, model_full), reference).mean()
            loss = loss + self.kl.coef * kl  # fixed or adaptive (kl_control)
            sums["kl_ref_token"] = kl.item() * n
        sums["loss"] = loss.item() * n
        first_ratio = (sampled.detach() - old).abs().max().item()
        return loss * share, sums, first_ratio

    def train_epoch(self, prompts: list[str]) -> dict:
        cfg = self.config
        batch = self.collect(prompts)
        advantages, informative = self.advantages(prompts, batch)
        # DAPO: groups without spread carry no advantage; left out, they neither dilute the step nor pull its KL
        kept = torch.nonzero(informative).reshape(-1) if cfg.drop_flat_groups else torch.arange(len(prompts))
        totals: dict[str, float] = {}
        grad_norms, ratio_first = [], 0.0
        for inner in range(cfg.inner_epochs if len(kept) else 0):
            # the same permutation in every process (and after a resume): it depends on (seed, epoch, inner) only
            order = kept[torch.randperm(len(kept), generator=seeded_generator("cpu", cfg.seed, self.epoch, inner, 1))]
            for step, index in enumerate(chunks(order, self.step_size)):
                def loss_of(micro, share, first_pass=inner == 0):
                    loss, sums, first = self.micro_batch_loss(batch, advantages, micro, share, first_pass)
                    return loss, (sums, first)

                grad_norm, results = self.updates.step(index, loss_of)  # this process's micro-batches, one update
                for sums, first in results:
                    for key, value in sums.items():
                        totals[key] = totals.get(key, 0.0) + value
                    if inner == 0 and step == 0:  # no update yet: every ratio must be 1
                        ratio_first = max(ratio_first, first)
                grad_norms.append(grad_norm)
        keys = sorted(totals) if totals else []
        keys = self.processes.gather_objects(keys)[0]  # process 0's keys (every process that ran has the same)
        summed = dict(zip(keys, self.processes.sum_floats([totals.get(k, 0.0) for k in keys])))
        images = summed.pop("images", 0)
        log = {k: v / images for k, v in summed.items() if k not in ("clamped_tokens", "support_flips")}
        log["informative_fraction"] = float(informative.float().mean())  # samples in groups with any spread
        log["updated_images"] = len(kept)
        log["clamped_tokens"] = int(summed.get("clamped_tokens", 0))
        if "support_flips" in summed:  # positions whose recomputed filter kept another set than the sampler's
            log["support_flips"] = int(summed["support_flips"])
        log["grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
        log["max_abs_logratio_first_step"] = self.processes.max_float(ratio_first)
        if "kl_ref_token" in log:  # the sequence KL: per-token KL summed over the image's tokens
            log["kl_ref_image"] = log["kl_ref_token"] * batch["tokens"].shape[1]
        log.update(self.reward_summary(batch["rewards"]))
        if self.processes.is_main and batch["images"] is not None:
            log.update(self.reward_precision_gap(batch["images"], batch["local_prompts"], batch["local_rewards"]))
        return log
