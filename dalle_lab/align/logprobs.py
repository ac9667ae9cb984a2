"""The policy's log-probabilities, exactly the sampler's, and the token statistics built on them (the per-token KL
to a reference and the entropy), which every fine-tuning method and the evaluation share.

The policy that fine-tuning optimises is the distribution the sampler draws from: guidance, temperature and the
top-k / top-p filter applied (`dalle_lab.generate.sampling.sampling_distribution`, the one definition). Two things
make a recomputation during the update differ from what the sampler recorded, and both are handled here:

- numerics: the sampler runs one cached step at a time, the update one teacher-forced pass. The model gives the same
  logits on both paths (float32: to float32 rounding; CPU bfloat16 autocast: bit for bit, one attention kernel), so
  `policy_logprobs` reproduces the recorded log-probs (tests/test_align_logprobs.py);
- the filter's support: top-k / top-p keep a set of tokens chosen from the logits. A near-tie at the boundary can fall
  the other way when the logits move by one rounding step (or after an update), and the sampled token would then get
  log-prob -inf: a ratio of 0 or infinity that contributes nothing. So the sampler records which tokens it kept at
  every position (`sample_with_support`, a bit mask), and the update renormalises the model's guided, tempered
  distribution over exactly that set. A recorded token is always inside it. How often the update's own filter would
  have chosen another set is counted (`support_flips`) and logged.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dalle_lab.generate import generate, sampling


def uses_filter(config) -> bool:
    """Whether the sampling distribution has a restricted support (top-k or top-p)."""
    return config.top_k is not None or (config.top_p is not None and config.top_p < 1.0)


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """(..., V) bool -> (..., ceil(V / 8)) uint8, eight tokens a byte (the support of a 8192-token vocabulary costs
    1 KiB per position instead of 8)."""
    pad = (-mask.shape[-1]) % 8
    bits = F.pad(mask, (0, pad)).view(*mask.shape[:-1], -1, 8).to(torch.uint8)
    weights = (2 ** torch.arange(8, device=mask.device, dtype=torch.uint8))
    return (bits * weights).sum(-1, dtype=torch.uint8)


def unpack_mask(packed: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Inverse of pack_mask: (..., ceil(V / 8)) uint8 -> (..., V) bool."""
    weights = (2 ** torch.arange(8, device=packed.device, dtype=torch.uint8))
    bits = (packed.unsqueeze(-1) & weights) != 0
    return bits.reshape(*packed.shape[:-1], -1)[..., :num_tokens]


def _resolved_top_k(config, num_tokens: int):
    return sampling.resolve_top_k(config.top_k, None, num_tokens)


@torch.no_grad()
def sample_with_support(dalle, text, config, generator: torch.Generator | None = None):
    """Sample image tokens with the config's sampling settings.

    Returns (tokens (B, N), log-probs of the sampled tokens (B, N), support): `support` is None without top-k / top-p,
    else the packed (B, N, ceil(V / 8)) mask of the tokens the sampler kept at each position, computed from the very
    logits it sampled from.
    """
    support = None
    callback = None
    if uses_filter(config):
        num_tokens = dalle.config.num_image_tokens
        top_k = _resolved_top_k(config, num_tokens)
        support = torch.zeros(text.shape[0], dalle.config.image_seq_len, (num_tokens + 7) // 8, dtype=torch.uint8,
                              device=text.device)

        def callback(position, cond, uncond):
            distribution = sampling.sampling_distribution(cond, uncond, config.cond_scale, config.temperature,
                                                          top_k, config.top_p)
            support[:, position] = pack_mask(torch.isfinite(distribution))

    tokens, logprobs = generate(dalle, text, config.generation(), generator=generator, logits_callback=callback)
    return tokens, logprobs, support


def _filtered(logits, config):
    """The sampler's top-k then top-p filter (sampling.sampling_distribution's steps 3 and 4)."""
    top_k = _resolved_top_k(config, logits.shape[-1])
    if top_k is not None:
        logits = sampling.filter_top_k(logits, top_k)
    if config.top_p is not None:
        logits = sampling.filter_top_p(logits, config.top_p)
    return logits


def guided_logits(dalle, text, tokens, config):
    """(B, N, V) float32 logits of the sampling distribution before filtering: guidance, then temperature, in the
    order and arithmetic of sampling.sampling_distribution. Also returns the plain conditional logits.

    With `config.guidance_grad == "conditional"` the caption-free branch is computed without gradient (T2I-R1's
    choice): the update then moves the model only through the captioned prediction, and the null-caption
    prediction that every prompt shares is not pushed by each prompt's advantage. The values are the same."""
    cond = dalle.logits(text, tokens)
    null = None
    if config.cond_scale != 1.0:
        with torch.set_grad_enabled(torch.is_grad_enabled() and config.guidance_grad == "both"):
            null = dalle.logits(dalle.null_text(text), tokens)
    logits = sampling.apply_guidance(cond.float(), None if null is None else null.float(), config.cond_scale)
    if config.temperature != 1.0:
        logits = logits / config.temperature
    return logits, cond


def policy_logprobs(dalle, text, tokens, config, support=None, return_flips: bool = False):
    """Recompute what the sampler did, with gradients: log-probs of `tokens` under the sampling distribution.

    support: the packed mask `sample_with_support` recorded (None: filter the recomputed logits afresh, as the
    sampler's top-k / top-p would). Returns (sampled_logprobs (B, N), sampling_logprobs_full (B, N, V),
    model_logprobs_full (B, N, V)), the last the plain conditional distribution; with return_flips also the number of
    positions whose own recomputed filter keeps a different set of tokens than `support`.
    """
    logits, cond = guided_logits(dalle, text, tokens, config)
    flips = 0
    if support is None:
        logits = _filtered(logits, config)
    else:
        kept = unpack_mask(support, logits.shape[-1])
        if return_flips:
            with torch.no_grad():
                flips = int((torch.isfinite(_filtered(logits.detach(), config)) != kept).any(-1).sum())
        logits = logits.masked_fill(~kept, float("-inf"))
    processed = logits.log_softmax(dim=-1)
    sampled = processed.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    result = (sampled, processed, F.log_softmax(cond.float(), dim=-1))
    return (*result, flips) if return_flips else result


def token_kl(policy_logprobs_full, reference_logprobs_full):
    """Exact per-token KL(policy || reference) over the whole image vocabulary: (B, N, V) log-probs -> (B, N).

    Zero when the two are the same distribution. Outside a filtered support both are -inf and p is 0: such tokens
    contribute 0; the difference is masked before the product so that neither the value nor the gradient sees
    -inf - -inf = nan.
    """
    p = policy_logprobs_full.exp()
    diff = torch.where(p > 0, policy_logprobs_full - reference_logprobs_full, torch.zeros_like(p))
    return (p * diff).sum(-1)


def token_entropy(logprobs_full):
    """Per-token entropy (nats) of a (B, N, V) log-prob tensor; filtered (-inf) entries contribute 0."""
    p = logprobs_full.exp()
    return -(p * torch.where(p > 0, logprobs_full, torch.zeros_like(logprobs_full))).sum(-1)
