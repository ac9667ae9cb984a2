"""Lossless speculative Jacobi decoding: several image tokens per transformer pass, same distribution as plain
sampling.

Each row keeps a window of W draft tokens for the positions after its committed ones, each draft drawn from a
proposal distribution q. One pass feeds the last committed token and the W drafts and returns, for every window
position, the model's distribution p given everything before it (the drafts included). Then, left to right:

- the first draft's p is conditioned on committed tokens only, so it is the exact next-token distribution; the
  draft is accepted with probability min(1, p(d) / q(d)); on rejection a token is drawn from the residual
  max(0, p - q) / sum(max(0, p - q)) and the row stops there. Either way the committed token is distributed
  exactly as p (the speculative-sampling identity: q(x) min(1, p/q) + P(reject) residual(x) = p(x));
- once a draft is accepted, the next position's p is conditioned on committed tokens only as well, and the same
  rule applies; if all W are accepted, one more token is drawn from the last p (a bonus token).

So every pass commits at least one token and every committed token is an exact sample. The distributions the pass
computed past the stopping point (conditioned on drafts that did not all survive) become the next proposals:
that is the Jacobi iteration (Song et al. 2021; Teng et al. 2024, "speculative Jacobi decoding"); the draft for a
position nothing has looked at yet is drawn from the last distribution computed. Any proposal keeps the result
exact, provided each draft is drawn from its q independently of the accept/reject coin flips, which it is.

p and q are the final sampling distributions (guidance, temperature, top-k, top-p applied; sampling.py), so the
whole sampling configuration is preserved, not only plain softmax sampling. Rows advance independently (each by
what it accepted): the KV cache is written by scatter at each row's positions and read under a position mask.
On the CPU a window pass costs more than the passes it saves (docs/performance.md), so `auto` never picks it.
"""
from __future__ import annotations

import torch

from .graphs import GraphedStep
from .sampling import draw


def acceptance(p_draft: torch.Tensor, q_draft: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Accept each draft with probability min(1, p/q): uniform in [0, 1) < p / q, computed without dividing
    (q > 0 for any sampled draft). All arguments (..., W); returns bool (..., W)."""
    return uniform * q_draft < p_draft


def leading_accepts(accepted: torch.Tensor) -> torch.Tensor:
    """(B, W) bool -> (B,) count of accepted drafts before the first rejection."""
    return accepted.long().cumprod(dim=-1).sum(dim=-1)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution to draw from after a rejection: max(0, p - q) normalised, (..., V).

    Where p <= q everywhere (p == q up to rounding) a rejection has probability 0; it can still happen through
    rounding, and p itself is then the right distribution."""
    r = (p - q).clamp_min(0)
    total = r.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(torch.finfo(r.dtype).tiny), p)


def window_slack(window: int) -> int:
    """Cache slots past the image a window of drafts may write into (a finished row keeps writing past the grid)."""
    return 2 * window + 2


def speculative_decode(dec, tokens: torch.Tensor, logprobs: torch.Tensor, n_init: int,
                       generator: torch.Generator | None = None, graphs: bool = False) -> None:
    """Fill tokens / logprobs (B, N) from n_init on, dec.config.speculative_window drafts per row and pass.
    dec: a decoder.Decoder with extra_len=window_slack(window); graphs: replay each window pass as a CUDA graph."""
    B, N = tokens.shape
    W, device = dec.config.speculative_window, tokens.device
    # Committed tokens and their log-probs, with room for a window that runs past the last grid position.
    out = torch.zeros(B, N + window_slack(W), dtype=tokens.dtype, device=device)
    out_lp = torch.zeros(B, N + window_slack(W), dtype=logprobs.dtype, device=device)
    out[:, :n_init] = tokens[:, :n_init]

    lp = dec.log_probs(dec.prefill(tokens[:, :n_init]))  # exact distribution of position n_init
    out[:, n_init] = draw(lp.exp(), generator)
    out_lp[:, n_init] = lp.gather(-1, out[:, n_init:n_init + 1]).squeeze(-1)
    committed = torch.full((B,), n_init + 1, dtype=torch.long, device=device)
    q = lp.exp().unsqueeze(1).expand(B, W, lp.shape[-1])  # first proposals: the one distribution known
    drafts = draw(q, generator)
    step = GraphedStep(dec, W + 1) if graphs else dec.step
    rows = torch.arange(B, device=device)
    offsets = torch.arange(W + 1, device=device)

    while bool((committed < N).any()):
        active = committed < N
        last = out.gather(1, (committed - 1).unsqueeze(1))
        index = (committed - 1).unsqueeze(1) + offsets  # grid indices of the fed tokens
        lp = dec.log_probs(step(torch.cat([last, drafts], dim=1), index))  # (B, W + 1, V): positions c..c+W
        p = lp.exp()
        p_draft = p[:, :W].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
        q_draft = q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
        uniform = torch.rand(B, W, device=device, generator=generator)
        n_acc = leading_accepts(acceptance(p_draft, q_draft, uniform))  # (B,)

        # The token after the accepted drafts: from the residual after a rejection, from p after W acceptances.
        p_stop = p[rows, n_acc]
        q_stop = q[rows, n_acc.clamp(max=W - 1)]
        stop_dist = torch.where((n_acc < W).unsqueeze(-1), residual(p_stop, q_stop), p_stop)
        # Next proposals for positions c'..c'+W-1: the distributions this pass computed for them (window slot
        # n_acc + 1 + i), and the last one computed for positions past the window.
        slot = (n_acc.unsqueeze(1) + 1 + offsets[:W]).clamp(max=W)
        q = p.gather(1, slot.unsqueeze(-1).expand(B, W, p.shape[-1]))
        drawn = draw(torch.cat([stop_dist.unsqueeze(1), q], dim=1), generator)  # one draw call for all of them
        new = drawn[:, 0]

        commit = torch.cat([drafts, new.unsqueeze(1)], dim=1)
        commit[rows, n_acc] = new  # window slot k holds the token committed at position c + k, for k <= n_acc
        # Slots past n_acc are written too: those positions are not committed yet, and the pass that commits them
        # writes them again; a finished row writes past the grid, into the buffers' slack.
        positions = committed.unsqueeze(1) + offsets
        out.scatter_(1, positions, commit)
        out_lp.scatter_(1, positions, lp.gather(-1, commit.unsqueeze(-1)).squeeze(-1))
        committed = torch.where(active, committed + n_acc + 1, committed)
        drafts = drawn[:, 1:]

    tokens[:, n_init:] = out[:, n_init:N]
    logprobs[:, n_init:] = out_lp[:, n_init:N]
