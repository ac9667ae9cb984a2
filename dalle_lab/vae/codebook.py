"""Codebook training and health for a taming VectorQuantizer2: nearest-code quantisation, EMA updates, dead-code
restarts, usage statistics.

A collapsed codebook (a few codes doing all the work) is the usual way VQ training fails, so the trainer updates
the codebook by exponential moving averages of the encoder outputs assigned to each code (more stable than the
gradient of taming's codebook loss) and re-initialises codes nobody used recently from recent encoder outputs.
The codebook tensor is taming's own `quantize.embedding.weight`, so the trained weights need no conversion.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def nearest_codes(z: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """(N, d) vectors -> (N,) index of the nearest codebook row (squared L2, as taming's VectorQuantizer2)."""
    distances = z.pow(2).sum(1, keepdim=True) - 2 * z @ codebook.t() + codebook.pow(2).sum(1)[None]
    return distances.argmin(1)


def usage_stats(counts: torch.Tensor) -> dict[str, float]:
    """Health of a codebook from per-code counts: perplexity (effective number of codes) and share used."""
    total = counts.sum()
    if total <= 0:
        return {"perplexity": 0.0, "codes_used": 0, "usage": 0.0}
    p = counts.float() / total
    entropy = -(p[p > 0] * p[p > 0].log()).sum()
    used = int((counts > 0).sum())
    return {"perplexity": float(entropy.exp()), "codes_used": used, "usage": used / counts.numel()}


class EMACodebook:
    """EMA statistics for one codebook plus the per-code usage window that drives dead-code restarts.

    `cluster_size` and `embed_sum` are the running (decayed) count and sum of the vectors assigned to each code;
    the code is their ratio. They live here, not in the model, and travel in the training checkpoint's
    `train_state` so a resumed run continues exactly.
    """

    def __init__(self, codebook: torch.Tensor, decay: float = 0.99, eps: float = 1e-5):
        self.codebook = codebook  # the parameter tensor itself (updated in place)
        self.decay, self.eps = decay, eps
        n = codebook.shape[0]
        self.cluster_size = torch.ones(n, device=codebook.device)
        self.embed_sum = codebook.detach().clone()
        self.recent_counts = torch.zeros(n, device=codebook.device)

    @torch.no_grad()
    def update(self, z: torch.Tensor, indices: torch.Tensor, ema: bool = True) -> None:
        """Record one batch's assignments ((N, d) vectors, (N,) codes); with `ema`, move codes to their means."""
        one_hot = F.one_hot(indices, self.codebook.shape[0]).type(z.dtype)
        counts = one_hot.sum(0)
        self.recent_counts += counts
        if not ema:
            return
        self.cluster_size.mul_(self.decay).add_(counts, alpha=1 - self.decay)
        self.embed_sum.mul_(self.decay).add_(one_hot.t() @ z, alpha=1 - self.decay)
        # Laplace smoothing keeps a code that lost all its vectors from dividing by ~0
        n = self.cluster_size.sum()
        smoothed = (self.cluster_size + self.eps) / (n + self.codebook.shape[0] * self.eps) * n
        self.codebook.data.copy_(self.embed_sum / smoothed[:, None])

    @torch.no_grad()
    def restart_dead(self, recent_z: torch.Tensor, generator: torch.Generator | None = None) -> int:
        """Re-initialise every code unused since the last restart to a recent encoder output.

        Outputs are drawn with probability proportional to their squared distance from their nearest code
        (as k-means++ seeds clusters): on Shapes most vectors are background, and uniform draws would spend the
        freed codes on background again while the rarer object vectors stay lumped together.
        Returns how many codes were restarted and starts a new usage window.
        """
        dead = (self.recent_counts == 0).nonzero().flatten()
        self.recent_counts.zero_()
        if dead.numel() == 0 or recent_z.shape[0] == 0:
            return 0
        errors = (recent_z - self.codebook[nearest_codes(recent_z, self.codebook)]).pow(2).sum(1)
        weights = errors.cpu().double() + 1e-12  # all-zero errors fall back to uniform
        picks = torch.multinomial(weights, dead.numel(), replacement=dead.numel() > weights.numel(),
                                  generator=generator).to(recent_z.device)
        fresh = recent_z[picks]
        self.codebook.data[dead] = fresh
        # restart the EMA statistics too, or the old (empty) averages would pull the code straight back
        self.cluster_size[dead] = 1.0
        self.embed_sum[dead] = fresh
        return int(dead.numel())

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"cluster_size": self.cluster_size, "embed_sum": self.embed_sum, "recent_counts": self.recent_counts}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name in ("cluster_size", "embed_sum", "recent_counts"):
            getattr(self, name).copy_(state[name])
