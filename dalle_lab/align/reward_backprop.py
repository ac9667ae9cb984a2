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

import contextlib

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as run_checkpointed

from dalle_lab.align.credit import checked_scores
from dalle_lab.align.logprobs import policy_logprobs, token_entropy, token_kl
from dalle_lab.align.trainer import AlignTrainer
from dalle_lab.rewards import is_differentiable
from dalle_lab.seeding import seeded_generator


def conditional_gumbel(logprobs, tokens, generator=None):
    """Perturbed log-probs z = log p + g with g ~ Gumbel, drawn conditionally on argmax z == tokens.

    logprobs: (..., V) normalised log-probs (entries of -inf allowed: they stay -inf); tokens: (...) long.
    generator: one torch.Generator, or a list of one per row of the first dimension (each image's noise then
    depends on its own generator only, whatever batch it is computed in).
    Top-down sampling: the maximum of log p + Gumbel is itself Gumbel-distributed with location logsumexp(log p) = 0;
    every other entry is an independent Gumbel truncated below that maximum.
    """
    logprobs = logprobs.detach().float()

    def gumbel(shape):
        if isinstance(generator, (list, tuple)):
            uniform = torch.stack([torch.rand(shape[1:], generator=g, device="cpu") for g in generator])
        else:
            uniform = torch.rand(shape, generator=generator, device="cpu")
        uniform = uniform.clamp_(1e-10, 1.0 - 1e-7)
        return (-torch.log(-torch.log(uniform))).to(logprobs.device)

    top = gumbel(tokens.shape).unsqueeze(-1)  # the maximum, location 0 because logprobs are normalised
    free = logprobs + gumbel(logprobs.shape)
    truncated = -torch.logaddexp(-top, -free)  # Gumbel(free) truncated to lie below `top`
    return truncated.scatter(-1, tokens.unsqueeze(-1), top)


def straight_through_tokens(logprobs, tokens, last_k: int, tau: float = 1.0, generator=None):
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


@contextlib.contextmanager
def relaxed_image_inputs(dalle, relaxed, start: int):
    """Inside the block, the transformer's image inputs at positions start.. are `relaxed` one-hots times the image
    embedding table instead of the embeddings of the hard ids (a forward hook on `dalle.image_emb`, so both the
    conditional and the guidance pass see them). The forward value is unchanged (relaxed is one-hot valued and a
    one-hot row times the table is that row exactly); the gradient flows from later positions into `relaxed`.

    relaxed: (B, N, V) token distributions of every image position; input i of the model is image token i, so inputs
    start .. N - 2 are replaced (the last token feeds nothing).
    """
    def hook(module, args, output):
        n = output.shape[1]  # the model feeds image tokens 0 .. n - 1
        if n <= start:
            return output
        window = relaxed[:, start:n].to(module.weight.dtype)
        with torch.autocast(output.device.type, enabled=False):
            soft = window @ module.weight
        return torch.cat([output[:, :start], soft.to(output.dtype)], dim=1)

    handle = dalle.image_emb.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def relaxed_chain(dalle, text, tokens, config, support, last_k: int, depth: int, noise, checkpoint: bool = False):
    """The straight-through tokens of one sampled batch, with the gradient through `depth` links of the chain.

    Pass 1 is a teacher-forced pass on the hard ids; its logits give relaxations r1 of the last `last_k` tokens.
    Pass d feeds r(d-1) forward as input embeddings inside the window (relaxed_image_inputs), so its logits, and
    the relaxations rd built from them, depend on how each window token shaped the later ones, up to d - 1 links
    deep. Every pass has the same forward value (one-hot valued relaxations), and the same Gumbel noise (`noise()`
    returns fresh per-image generators with the same seeds), so depth only changes the gradient; depth = last_k
    is the whole chain of the window (what unrolling the sampler would give), depth 1 the own-logits-only gradient.
    checkpoint: recompute each pass in the backward instead of keeping its activations (memory of one pass).

    Returns (relaxed (B, N, V) of the last pass, [(sampling log-probs, plain conditional log-probs), (B, N, V)
    each, of every pass]).
    """
    start = tokens.shape[1] - last_k
    passes = []

    def one_pass(previous):
        context = relaxed_image_inputs(dalle, previous, start) if previous is not None else contextlib.nullcontext()
        with context:
            _, processed, model_full = policy_logprobs(dalle, text, tokens, config, support)
        return straight_through_tokens(processed, tokens, last_k, config.gumbel_tau, noise()), processed, model_full

    relaxed = None
    for _ in range(max(1, depth)):
        if checkpoint and torch.is_grad_enabled():
            relaxed, processed, model_full = run_checkpointed(one_pass, relaxed, use_reentrant=False)
        else:
            relaxed, processed, model_full = one_pass(relaxed)
        passes.append((processed, model_full))
    return relaxed, passes


class RewardBackpropTrainer(AlignTrainer):
    """One gradient step per sampled batch on -reward(decode_soft(relaxed tokens)); see the module docstring."""

    needs_reference = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not is_differentiable(self.reward):
            given = kwargs.get("reward")
            name = getattr(given, "__name__", repr(given)) if given is not None else repr(self.config.reward)
            raise ValueError(f"reward backpropagation needs a differentiable reward; {name} is not marked as one "
                             "(JPEG size and the Shapes checker are not differentiable; your own function: set "
                             "its `differentiable = True`). Use negative_total_variation (a compressibility proxy), "
                             "brightness or aesthetic, or --method policy_gradient")
        if not hasattr(self.dalle.vae, "decode_soft"):
            raise ValueError("reward backpropagation needs an image tokenizer with decode_soft(probs)")

    def truncation(self, step: int) -> int:
        """K for one optimizer step: backprop_last_k, or with backprop_last_k_min AlignProp's randomised truncation,
        K uniform in [backprop_last_k_min, backprop_last_k] from a generator keyed by (seed, epoch, step), so every
        process and every split of the step draws the same K."""
        cfg = self.config
        if cfg.backprop_last_k_min is None:
            return cfg.backprop_last_k
        generator = seeded_generator("cpu", cfg.seed, self.epoch, step, 3)
        return int(torch.randint(cfg.backprop_last_k_min, cfg.backprop_last_k + 1, (1,), generator=generator))

    def backprop_loss(self, text, tokens, prompts, support=None, last_k=None, noise=None):
        """Loss (mean over the batch), rewards (detached), images (detached) and stats for one sampled batch.
        noise: a function returning the Gumbel generators (one per image); default the trainer's generator."""
        cfg = self.config
        last_k = max(1, min(cfg.backprop_last_k if last_k is None else last_k, tokens.shape[1]))
        if noise is None:  # one seed for every pass of this batch, drawn from the trainer's generator
            seed = int(torch.randint(2 ** 62, (1,), generator=self.generator))

            def noise():
                return torch.Generator().manual_seed(seed)
        depth = last_k if cfg.backprop_chain_depth is None else min(cfg.backprop_chain_depth, last_k)
        relaxed, passes = relaxed_chain(self.dalle, text, tokens, cfg, support, last_k, depth, noise,
                                        checkpoint=bool(cfg.backprop_checkpoint))
        processed, model_full = passes[-1]
        images = self.dalle.vae.decode_soft(relaxed)
        rewards = self.reward(images, prompts)
        checked_scores(rewards, prompts)  # a NaN reward would make every weight NaN: refused, naming the caption
        loss = -rewards.float().mean()
        stats = {"entropy": token_entropy(processed.detach()).mean().item()}
        if self.has_reference:
            start = tokens.shape[1] - max(0, min(last_k, tokens.shape[1]))
            reference = self.kl_reference_logprobs(text, tokens, support)
            policy = self.kl_policy_logprobs(processed, model_full)
            kl_tail = token_kl(policy[:, start:], reference[:, start:])
            with torch.no_grad():
                stats["kl_ref_token"] = token_kl(policy, reference).mean().item()
            if kl_tail.numel():
                loss = loss + self.kl.coef * kl_tail.mean()
        return loss, rewards.detach(), images.detach(), stats

    def sample_step(self, step: int, step_prompts: list[str]) -> tuple:
        """Sample one optimizer step's images with the current weights: this process samples its chunks (generators
        keyed by epoch, step, chunk), then every process gets the whole step's (text, tokens, support) in order, so
        the step's micro-batches can be dealt over processes like the policy gradient's."""
        rows = []
        for chunk, part in self.sample_chunks(len(step_prompts)):
            text = self.tokenize(step_prompts[part])
            tokens, _, support = self.sample_tokens(text, self.chunk_generator(self.epoch, step, chunk))
            rows.append((part.start, text.cpu(), tokens.cpu(), None if support is None else support.cpu()))
        rows = sorted((row for part in self.processes.gather_objects(rows) for row in part), key=lambda r: r[0])
        text, tokens = (torch.cat([r[i] for r in rows]).to(self.device) for i in (1, 2))
        support = None if rows[0][3] is None else torch.cat([r[3] for r in rows]).to(self.device)
        return text, tokens, support

    def train_epoch(self, prompts: list[str]) -> dict:
        """Optimizer steps over `step_size` samples each, sampled with the current weights (sample_step), then
        backpropagated in micro-batches dealt over processes, each loss scaled by its share of the step (updates.py);
        gradients are summed across processes once per step."""
        cfg = self.config
        totals: dict[str, float] = {}
        rewards, images_local, prompts_local, grad_norms = [], [], [], []
        for step, start in enumerate(range(0, len(prompts), self.step_size)):
            step_prompts = prompts[start:start + self.step_size]
            last_k = self.truncation(step)
            text, tokens, support = self.sample_step(step, step_prompts)

            def loss_of(micro, share, start=start, last_k=last_k):
                # each image's Gumbel noise from its own generator (its position in the epoch): the same whatever
                # micro-batch or process it is in
                def noise():
                    return [seeded_generator("cpu", cfg.seed, self.epoch, start + int(i), 2) for i in micro]

                loss, batch_rewards, images, stats = self.backprop_loss(
                    text[micro], tokens[micro], [step_prompts[i] for i in micro],
                    None if support is None else support[micro], last_k, noise)
                stats["loss"] = loss.item()
                return loss * share, (micro, batch_rewards, images, stats)

            grad_norm, results = self.updates.step(torch.arange(len(step_prompts)), loss_of)
            for micro, batch_rewards, images, stats in results:
                for key, value in stats.items():
                    totals[key] = totals.get(key, 0.0) + value * len(micro)
                totals["images"] = totals.get("images", 0.0) + len(micro)
                rewards.append((start + micro, batch_rewards.float().cpu().reshape(-1)))
                images_local.append(images.cpu())
                prompts_local += [step_prompts[i] for i in micro]
            grad_norms.append(grad_norm)
        keys = self.processes.gather_objects(sorted(totals))[0]
        summed = dict(zip(keys, self.processes.sum_floats([totals.get(k, 0.0) for k in keys])))
        count = summed.pop("images")
        log = {k: v / count for k, v in summed.items()}
        log["grad_norm"] = float(np.mean(grad_norms))
        if "kl_ref_token" in log:
            log["kl_ref_image"] = log["kl_ref_token"] * self.dalle.config.image_seq_len
        local_rewards = torch.cat([r for _, r in rewards]) if rewards else torch.zeros(0)
        local_index = torch.cat([i for i, _ in rewards]) if rewards else torch.zeros(0, dtype=torch.long)
        log.update(self.reward_summary(self.gather_rows({"rewards": local_rewards}, local_index)["rewards"]))
        if self.processes.is_main and images_local:
            log.update(self.reward_precision_gap(torch.cat(images_local), prompts_local, local_rewards))
        return log
