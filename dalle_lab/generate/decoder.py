"""The rows of one generation over one KV cache, and the passes every strategy is made of.

`Decoder` holds the caption rows (and, under classifier-free guidance, the caption-free rows after them, so one
batched pass serves both distributions) and one KV cache per layer (cache.py). Its passes go through the network's
modules (the model's public interface: embed, embed_image, transformer, final, to_image_logits):
- `prefill(prime)`: BOS + text (+ primed image tokens) in one pass; the logits of the next image position;
- `step_at(tokens, at)`: one token per row, every row at grid index `at` (plain decoding);
- `step(tokens, index)`: tokens at grid indices index (B, n), each row at its own positions: speculative windows,
  and the fixed-shape passes a CUDA graph captures;
- `full(tokens)`: no cache, the whole prefix again (DALLE-pytorch's use_cache=False; the reference of the tests).
The fused and compiled strategies replace `step_at` with the model's fused step over the same caches
(strategy.py builds them).
"""
from __future__ import annotations

import torch

from .cache import new_caches
from .config import GenerationConfig
from .sampling import sampling_distribution


class Decoder:
    def __init__(self, model, text_ids: torch.Tensor, config: GenerationConfig, extra_len: int = 0):
        """text_ids (B, T): the captions as the network reads them (model.text_ids); extra_len: cache slots past
        the image end (speculative windows and graph warm-ups write past the last position)."""
        cfg = model.config
        self.model, self.config = model, config
        self.batch, self.T, self.N = text_ids.shape[0], cfg.text_seq_len, cfg.image_seq_len
        self.repeat = 2 if config.guided else 1
        # Conditional rows first, unconditional rows after: one batched forward serves both passes.
        self.text_ids = (torch.cat([text_ids, model.text_ids(model.null_text(text_ids))])
                         if config.guided else text_ids)
        self.rows = self.batch * self.repeat
        self.max_len = self.T + self.N + extra_len
        self.caches = new_caches(cfg.depth, self.max_len)
        self.cells = model.image_positions()  # (N, dim), once per generation
        self.top_k = config.top_k_of(cfg.num_image_tokens)
        self.calls = 0  # transformer passes so far

    def _rows(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens if self.repeat == 1 else tokens.repeat(self.repeat, *([1] * (tokens.dim() - 1)))

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.to_image_logits(self.model.final(h))

    def embed(self, tokens: torch.Tensor, index: torch.Tensor | int) -> torch.Tensor:
        """Image tokens (B, n) at grid indices (B, n) (or all at one int index) -> the embedded rows (rows, n, dim)."""
        return self._rows(self.model.embed_image(tokens, index, self.cells))

    def prefill(self, prime: torch.Tensor) -> torch.Tensor:
        """prime: (B, n_init) image tokens (n_init may be 0) -> logits (rows, V) for image position n_init."""
        self.calls += 1
        h, _ = self.model.transformer(self.model.embed(self.text_ids, self._rows(prime)), caches=self.caches, start=0)
        return self._logits(h[:, -1])

    def full(self, tokens: torch.Tensor) -> torch.Tensor:
        """No cache: the whole prefix BOS + text + tokens (B, i) again -> logits (rows, V) for image position i."""
        self.calls += 1
        h, _ = self.model.transformer(self.model.embed(self.text_ids, self._rows(tokens)))
        return self._logits(h[:, -1])

    def step_at(self, tokens: torch.Tensor, at: int) -> torch.Tensor:
        """Feed tokens (B, 1) at grid index `at` of every row -> logits (rows, V) for position at + 1."""
        self.calls += 1
        h, _ = self.model.transformer(self.embed(tokens, at), caches=self.caches, start=self.T + 1 + at)
        return self._logits(h)[:, 0]

    def step(self, tokens: torch.Tensor, index: torch.Tensor, kv_len: int | None = None) -> torch.Tensor:
        """Feed tokens (B, n) at grid indices index (B, n), each row at its own positions -> logits (rows, n, V);
        column j predicts the token at index[:, j] + 1. kv_len: key slots attended (default the smallest that
        covers every row; graphs pass the full length). Indices past the grid (the tail of a speculative window)
        are allowed: their outputs are garbage that the caller never commits."""
        self.calls += 1
        positions = self.T + 1 + self._rows(index)  # image token i sits at sequence position 1 + T + i
        if kv_len is None:
            kv_len = int(positions.max()) + 1
        h, _ = self.model.transformer(self.embed(tokens, index), caches=self.caches, positions=positions,
                                      kv_len=kv_len)
        return self._logits(h)

    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits (rows, ..., V) -> log-probs (B, ..., V) of the final sampling distribution (guidance applied)."""
        c = self.config
        cond, uncond = self.split(logits)
        return sampling_distribution(cond, uncond, c.cond_scale, c.temperature, self.top_k, c.top_p)

    def split(self, logits: torch.Tensor):
        """(conditional, unconditional or None) logits."""
        return (logits[:self.batch], logits[self.batch:]) if self.config.guided else (logits, None)
