"""dalle_lab.generate.sampling: pure functions on image-token logits."""
import math

import pytest
import torch

from dalle_lab.generate.sampling import (apply_guidance, filter_top_k, filter_top_p, resolve_top_k, sample_from_log_probs,
                                sampling_distribution)


def test_filter_thres_counts_the_image_vocabulary_only():
    assert resolve_top_k(None, 0.9, 512) == 51  # the top 10% of 512 image tokens
    assert resolve_top_k(None, 0.0, 512) == 512
    assert resolve_top_k(None, 0.999, 100) == 1  # never fewer than one
    assert resolve_top_k(7, None, 512) == 7
    assert resolve_top_k(None, None, 512) is None
    with pytest.raises(ValueError, match="not both"):
        resolve_top_k(5, 0.9, 512)
    with pytest.raises(ValueError, match="filter_thres"):
        resolve_top_k(None, 1.0, 512)


def test_top_k_keeps_exactly_k_largest():
    logits = torch.randn(4, 512)
    kept = filter_top_k(logits, 51)
    assert (torch.isfinite(kept).sum(-1) == 51).all()
    expected = logits.topk(51, dim=-1).indices.sort(-1).values
    assert torch.equal(torch.isfinite(kept).nonzero()[:, 1].view(4, 51), expected)
    # ties at the boundary still keep exactly k
    assert torch.isfinite(filter_top_k(torch.zeros(2, 10), 3)).sum(-1).tolist() == [3, 3]


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    kept = lambda p: torch.isfinite(filter_top_p(logits, p)).sum().item()  # noqa: E731
    assert kept(0.5) == 1
    assert kept(0.6) == 2
    assert kept(0.8) == 2
    assert kept(0.81) == 3
    assert kept(1.0) == 4
    assert kept(0.01) == 1  # always at least the most likely token
    shuffled = logits[:, [2, 0, 3, 1]]
    assert torch.isfinite(filter_top_p(shuffled, 0.6)).tolist() == [[False, True, False, True]]


def test_guidance_formula_and_identity_at_scale_one():
    cond, uncond = torch.randn(2, 8), torch.randn(2, 8)
    torch.testing.assert_close(apply_guidance(cond, uncond, 3.0), uncond + 3.0 * (cond - uncond))
    assert apply_guidance(cond, None, 1.0) is cond
    with pytest.raises(ValueError, match="unconditional"):
        apply_guidance(cond, None, 2.0)


def test_sampling_distribution_applies_temperature_then_filters():
    logits = torch.randn(3, 64)
    log_probs = sampling_distribution(logits, temperature=0.5, top_k=5)
    assert log_probs.dtype == torch.float32
    assert (torch.isfinite(log_probs).sum(-1) == 5).all()
    top = logits.topk(5, dim=-1)
    expected = (top.values / 0.5).log_softmax(-1)
    torch.testing.assert_close(log_probs.gather(-1, top.indices), expected)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(3))
    with pytest.raises(ValueError, match="top_k=1"):
        sampling_distribution(logits, temperature=0.0)
    # bfloat16 logits are handled in float32
    assert sampling_distribution(logits.bfloat16()).dtype == torch.float32


def test_sampling_respects_filtered_tokens_and_generator():
    log_probs = sampling_distribution(torch.randn(1000, 32), top_k=3)
    tokens, token_lp = sample_from_log_probs(log_probs, torch.Generator().manual_seed(0))
    assert torch.isfinite(log_probs.gather(-1, tokens[:, None])).all()
    torch.testing.assert_close(token_lp, log_probs.gather(-1, tokens[:, None]).squeeze(-1))
    again, _ = sample_from_log_probs(log_probs, torch.Generator().manual_seed(0))
    assert torch.equal(tokens, again)
    # greedy: top_k=1 always picks the argmax with log-prob 0
    logits = torch.randn(5, 32)
    greedy, lp = sample_from_log_probs(sampling_distribution(logits, top_k=1))
    assert torch.equal(greedy, logits.argmax(-1)) and torch.allclose(lp, torch.zeros(5))


def test_sampled_frequencies_follow_the_distribution():
    logits = torch.tensor([[0.0, math.log(3.0)]]).expand(4000, 2)
    tokens, _ = sample_from_log_probs(sampling_distribution(logits), torch.Generator().manual_seed(1))
    assert abs(tokens.float().mean().item() - 0.75) < 0.03
