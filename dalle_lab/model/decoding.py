"""Cached decoding of image tokens: the incremental forward passes generation is built from, and the plain loop.

`Decoder` owns the KV caches of one batch of prompt rows (the caption rows, and the caption-free rows after them
when classifier-free guidance is on) and offers two calls, in the shape gpt-fast gave the decode loop:
- `prefill(prime)`: BOS + text (+ primed image tokens) in one pass; returns the logits of the next image position;
- `step(tokens, index)`: feed image tokens at grid indices `index` (B, n) (each row at its own position) and return
  the logits they predict, (rows, n, V). One token per row is plain decoding; a window of drafts is speculative
  decoding (speculative.py).
With `static=True` the caches are StaticKVCache: fixed shapes, a position mask instead of a growing prefix, so a
step can be captured as a CUDA graph (graphs.py). Otherwise the growing KVCache is used (one token per step,
all rows at the same position), the cheapest layout for plain CPU decoding; there, with `fused=True`, a one-token
step runs as one FusedStep (fused_step.py: the same function in far fewer ops) where the model supports it, and
with `compiled=True` as one graph compiled by Inductor (compiled_step.py, opt-in: it costs a compile).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from ..sampling import sample_from_log_probs, sampling_distribution
from .compiled_step import CompiledStep, compiled_supported
from .fused_step import FusedStep, fused_supported
from .linear import packed_linears
from .threads import decode_threads


class Sampling(NamedTuple):
    """What turns logits into the distribution tokens are drawn from (see dalle_lab.sampling)."""
    cond_scale: float = 1.0
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    @property
    def guided(self) -> bool:
        return self.cond_scale != 1.0


class Decoder:
    def __init__(self, model, text_ids: torch.Tensor, sampling: Sampling, static: bool = False, extra_len: int = 0,
                 fused: bool = False, compiled: bool = False):
        """text_ids: (B, T) remapped caption ids (model._text_ids); extra_len: cache slots past the image end
        (speculative windows run past the last position); fused: one-token steps over the growing cache through
        FusedStep where fused_supported(model) (built at the first step, once the prefill has filled the cache);
        compiled: the same steps through CompiledStep where compiled_supported(model) (else as `fused` says)."""
        cfg = model.config
        self.model, self.sampling, self.static = model, sampling, static
        self.batch, self.T, self.N = text_ids.shape[0], cfg.text_seq_len, cfg.image_seq_len
        self.repeat = 2 if sampling.guided else 1
        # Conditional rows first, unconditional rows after: one batched forward serves both passes.
        self.text_ids = (torch.cat([text_ids, model._text_ids(model.null_text(text_ids))])
                         if sampling.guided else text_ids)
        self.max_len = self.T + self.N + extra_len
        self.caches = model.transformer.new_caches(max_len=self.max_len, static=static)
        self.image_pos = model._image_pos()  # (N, dim), computed once
        self.calls = 0  # transformer passes so far
        self.fused = fused and not static and fused_supported(model, self.image_pos.dtype)
        self.compiled = compiled and not static and compiled_supported(model, self.image_pos.dtype)
        self._fused_step = None

    def _rows(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens if self.repeat == 1 else tokens.repeat(self.repeat, *([1] * (tokens.dim() - 1)))

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.to_image_logits(self.model._final(h))

    def prefill(self, prime: torch.Tensor) -> torch.Tensor:
        """prime: (B, n_init) image tokens (n_init may be 0) -> logits (rows, V) for image position n_init."""
        x = self.model._embed(self.text_ids, self._rows(prime))
        self.calls += 1
        if self.static:
            positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
            h, _ = self.model.transformer(x, caches=self.caches, positions=positions, kv_len=x.shape[1])
        else:
            h, _ = self.model.transformer(x, caches=self.caches, start=0)
        return self._logits(h[:, -1])

    def step(self, tokens: torch.Tensor, index: torch.Tensor, kv_len: int | None = None,
             at: int | None = None) -> torch.Tensor:
        """Feed image tokens (B, n) at grid indices index (B, n) -> logits (rows, n, V); column j predicts the token
        at index[:, j] + 1. kv_len: key slots attended (static caches; default the smallest that covers every row;
        graphs pass the full length). at: the grid index every row feeds at (the growing cache needs it as an int).
        Indices past the grid (the tail of a speculative window) are allowed: their
        outputs are garbage that the caller never commits."""
        self.calls += 1
        x = self.model.image_emb(tokens) + self.image_pos[index.clamp(max=self.N - 1)]
        x, rows_index = self._rows(x), self._rows(index)
        positions = self.T + 1 + rows_index  # image token i sits at sequence position 1 + T + i
        if self.static:
            if kv_len is None:
                kv_len = int(positions.max()) + 1
            h, _ = self.model.transformer(x, caches=self.caches, positions=positions, kv_len=kv_len)
        else:
            if tokens.shape[1] != 1 or at is None:
                raise ValueError("the growing KVCache decodes one token per step, all rows at grid index `at`; "
                                 "use Decoder(static=True) for windows or rows at different positions")
            if self.fused or self.compiled:
                if self._fused_step is None:
                    self._fused_step = (CompiledStep(self.model, self.caches, x.shape[0], start=self.T + 1 + at)
                                        if self.compiled else FusedStep(self.model, self.caches, rows=x.shape[0]))
                return self._fused_step(x.view(x.shape[0], -1), self.T + 1 + at).unsqueeze(1)
            h, _ = self.model.transformer(x, caches=self.caches, start=self.T + 1 + at)
        return self._logits(h)

    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits (rows, ..., V) -> log-probs (B, ..., V) of the final sampling distribution (guidance applied)."""
        s, b = self.sampling, self.batch
        cond, uncond = (logits[:b], logits[b:]) if s.guided else (logits, None)
        return sampling_distribution(cond, uncond, s.cond_scale, s.temperature, s.top_k, s.top_p)

    def split(self, logits: torch.Tensor):
        """(conditional, unconditional or None) logits, for callbacks."""
        return (logits[:self.batch], logits[self.batch:]) if self.sampling.guided else (logits, None)


def plain_decode(model, text_ids: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor, n_init: int,
                 sampling: Sampling, generator: torch.Generator | None = None, use_cache: bool = True,
                 static: bool = False, prepack: bool = True, graphs: bool = False, fused: bool = True,
                 single_thread: bool = True, compiled: bool = False,
                 logits_callback: Callable[[int, torch.Tensor, torch.Tensor | None], None] | None = None) -> int:
    """One token per transformer pass, in order; fills tokens / logprobs (B, N) from n_init on. Returns the pass
    count. Without the cache every pass reruns the whole prefix (the reference the cached path is tested against).
    prepack: multiply with weights packed once for the step's rows (linear.py). graphs: replay the step as a CUDA
    graph over a static cache (graphs.py; on the CPU the same fixed-shape step, uncaptured). Off by default until it
    has been measured on a GPU (benchmarks/perf/run.py --device cuda). fused: one-token steps through FusedStep
    where the model supports it (fused_step.py; other models and the static cache keep the module path).
    single_thread: cached passes of few rows run on one thread where OpenMP threads sleep between ops (threads.py),
    the caller's count restored after. compiled: one-token steps through the Inductor-compiled graph
    (compiled_step.py; costs a compile, then reused while the weights stay the same).
    """
    graphs = use_cache and graphs
    dec = Decoder(model, text_ids, sampling, static=static or graphs, extra_len=1 if graphs else 0, fused=fused,
                  compiled=compiled and use_cache)
    rows = dec.batch * dec.repeat
    # The compiled graph multiplies with its own frozen weights: eager packs would be built for nothing.
    with packed_linears(model, rows=rows, enabled=prepack and use_cache and not dec.compiled), \
            decode_threads(rows, enabled=single_thread and use_cache):
        return _plain_loop(model, dec, tokens, logprobs, n_init, generator, use_cache, logits_callback, graphs)


def _plain_loop(model, dec, tokens, logprobs, n_init, generator, use_cache, logits_callback, graphs) -> int:
    N = tokens.shape[1]
    graphed = None
    logits = dec.prefill(tokens[:, :n_init]) if use_cache else None
    if graphs:
        from .graphs import GraphedStep  # graphs.py builds on this module

        graphed = GraphedStep(dec, 1)
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    for i in range(n_init, N):
        if not use_cache:
            dec.calls += 1
            h, _ = model.transformer(model._embed(dec.text_ids, dec._rows(tokens[:, :i])))
            logits = dec._logits(h[:, -1])
        elif i > n_init:  # feed the token sampled last step, at grid index i - 1
            index = torch.full_like(rows, i - 1).unsqueeze(1)
            if graphed is not None:
                logits = graphed(tokens[:, i - 1:i], index)[:, 0]
            else:
                logits = dec.step(tokens[:, i - 1:i], index, kv_len=dec.T + i + 1, at=i - 1)[:, 0]
        if logits_callback is not None:
            logits_callback(i, *dec.split(logits))
        tokens[:, i], logprobs[:, i] = sample_from_log_probs(dec.log_probs(logits), generator)
    return dec.calls
