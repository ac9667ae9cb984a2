"""Best-of-n fine-tuning (rejection sampling fine-tuning: RAFT, ReST, expert iteration) for verifiable rewards.

Per epoch: sample a group of `group_size` images for each prompt with the configured sampling (guidance included),
score them, keep each group's best samples (those scoring the group's maximum, when the group's scores differ:
a group whose samples all score the same says nothing about what to change), and train the model's plain
conditional distribution on the kept token sequences by cross-entropy (teacher forcing), plus the per-token KL to
the starting model of both the conditional and the unconditional (all-pad caption) distributions.

Why beside the policy gradient: every token of an image shares one reward, and most of an image's tokens are
background cells for which the VQGAN has many near-equivalent codes, so a token-level policy gradient spends most of
its update on noise (negative advantages push probability mass from one background code to its equivalents). A
cross-entropy step on the best samples only moves probability towards token sequences that were verified correct;
it never pushes mass away from tokens, so the noise does not accumulate as entropy. Guided sampling uses
`null + s (cond - null)`: training the conditional branch on verified samples moves the guided distribution the same
way, and the unconditional branch stays the pretrained one (nothing drifts where no loss looks).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from dalle_lab.align.logprobs import token_kl
from dalle_lab.align.trainer import AlignTrainer, chunks


def select_best(prompts, rewards, min_reward: float | None = None) -> np.ndarray:
    """Indices of the samples that score their group's maximum, for groups (same prompt) whose scores differ; with
    `min_reward`, only those that also score at least that (e.g. only exact matches: a group's best may still be
    wrong in one attribute, and training on it reinforces the near miss)."""
    rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
    prompts = np.asarray(list(prompts), dtype=object)
    keep = []
    for prompt in dict.fromkeys(prompts.tolist()):
        index = np.flatnonzero(prompts == prompt)
        group = rewards[index]
        if group.max() > group.min() and (min_reward is None or group.max() >= min_reward):
            keep.extend(index[group == group.max()].tolist())
    return np.asarray(sorted(keep), dtype=np.int64)


class BestOfNTrainer(AlignTrainer):
    needs_reference = True
    several_processes = False  # every process would sample and step on the whole epoch

    def train_epoch(self, prompts: list[str]) -> dict:
        cfg = self.config
        texts, tokens, futures = [], [], []
        with torch.no_grad():
            for batch_prompts in chunks(prompts, cfg.sample_batch_size):
                text = self.tokenize(batch_prompts)
                images, batch_tokens, _ = self.sample(text)
                futures.append(self.reward_worker.submit(images, batch_prompts))
                texts.append(text)
                tokens.append(batch_tokens)
        rewards = torch.cat([future.result().float().cpu().reshape(-1) for future in futures])
        text, tokens = torch.cat(texts), torch.cat(tokens)
        keep = torch.as_tensor(select_best(prompts, rewards.numpy(), cfg.best_of_n_min_reward))
        sums: dict[str, list[float]] = {"loss": [], "nll": [], "kl_ref_token": [], "kl_null_token": [], "grad_norm": []}
        if len(keep):
            for _ in range(cfg.inner_epochs):
                order = keep[torch.randperm(len(keep), generator=self.generator)]
                for index in chunks(order, cfg.train_batch_size):
                    t, k = text[index], tokens[index]
                    logprobs = F.log_softmax(self.dalle.logits(t, k).float(), dim=-1)
                    nll = -logprobs.gather(-1, k.unsqueeze(-1)).squeeze(-1).mean()
                    loss = nll
                    if self.has_reference:
                        kl = token_kl(logprobs, self.reference_logprobs(t, k)).mean()
                        # the unconditional branch shares every weight but sees no loss of its own: without this
                        # term it drifts, and guided sampling (null + s (cond - null)) drifts with it
                        null = self.dalle.null_text(t)
                        null_logprobs = F.log_softmax(self.dalle.logits(null, k).float(), dim=-1)
                        kl_null = token_kl(null_logprobs, self.reference_logprobs(null, k)).mean()
                        loss = loss + self.kl.coef * (kl + kl_null)
                        sums["kl_ref_token"].append(kl.item())
                        sums["kl_null_token"].append(kl_null.item())
                    sums["grad_norm"].append(self.step(loss))
                    sums["loss"].append(loss.item())
                    sums["nll"].append(nll.item())
        log = {key: float(np.mean(values)) for key, values in sums.items() if values}
        if "kl_ref_token" in log:
            log["kl_ref_image"] = log["kl_ref_token"] * tokens.shape[1]
        log["kept_fraction"] = len(keep) / len(prompts)
        log.update(self.reward_summary(rewards))
        return log
