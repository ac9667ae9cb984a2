"""GenerationConfig: what distribution image tokens are drawn from (sampling) and how the passes run (strategy).

The sampling fields decide WHICH images come out for a seed; the strategy decides only how fast (every one-token
strategy samples the module path's tokens for a fixed seed; speculative decoding draws other tokens from the same
distribution). The defaults are generate.py's: calibrated on the main job's model (lab/studies/recipe/), where
guidance 2 lifted exact match on unseen captions the most and 3 and more lost accuracy again. `DALLE.generate_images` keeps
DALLE-pytorch's neutral defaults instead (temperature 1, no filtering, no guidance) and builds its config from them.
"""
from __future__ import annotations

from dataclasses import dataclass

from .sampling import resolve_top_k

# How the decode passes run (all over one KV cache, generate/cache.py):
#   auto         the fastest exact path this model and machine support (choose_strategy in generate/strategy.py)
#   plain        one token per pass through the network's modules (the reference the fast paths are tested against)
#   fused        one token per pass through the model's fused step (few ops, prepacked weights)
#   compiled     the fused step's function compiled by TorchInductor (costs a compile; CPU float32)
#   speculative  lossless speculative Jacobi decoding: windows of drafts per pass, other tokens, same distribution
#   graph        one token per pass over fixed shapes, captured as a CUDA graph on a GPU (uncaptured on the CPU)
#   uncached     every pass reruns the whole prefix (DALLE-pytorch's use_cache=False)
STRATEGIES = ("auto", "plain", "fused", "compiled", "speculative", "graph", "uncached")
DEFAULT_WINDOW = 8  # speculative drafts per pass


@dataclass(frozen=True)
class GenerationConfig:
    # sampling (generate/sampling.py applies them in this order: guidance, temperature, top-k, top-p)
    top_k: int | None = 10  # keep the k likeliest image tokens (None: no top-k)
    filter_thres: float | None = None  # DALLE-pytorch's form of top-k: keep the top 1 - filter_thres fraction
    top_p: float | None = None  # nucleus sampling
    temperature: float = 0.7
    cond_scale: float = 2.0  # classifier-free guidance; 1 = plain conditional sampling
    # strategy
    strategy: str = "auto"
    speculative_window: int = DEFAULT_WINDOW

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown generation strategy {self.strategy!r}; choose from {', '.join(STRATEGIES)}")
        if self.top_k is not None and self.filter_thres is not None:
            raise ValueError(f"give top_k ({self.top_k}) or filter_thres ({self.filter_thres}), not both "
                             "(GenerationConfig's top_k defaults to 10: pass top_k=None with filter_thres)")
        resolve_top_k(self.top_k, self.filter_thres, num_tokens=1)  # their ranges, checked where they are used
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}; for greedy decoding use top_k=1")
        if self.speculative_window < 1:
            raise ValueError(f"speculative_window must be >= 1, got {self.speculative_window}")

    @property
    def guided(self) -> bool:
        return self.cond_scale != 1.0

    def top_k_of(self, num_tokens: int) -> int | None:
        """The number of tokens top-k keeps over a vocabulary of num_tokens (filter_thres resolved), or None."""
        return resolve_top_k(self.top_k, self.filter_thres, num_tokens)
