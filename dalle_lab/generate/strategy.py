"""Which strategy a generation runs, decided in one function, and the one-token step each strategy decodes with.

Every strategy decodes over the same KV cache (cache.py) through the same Decoder (decoder.py); they differ only in
how a pass is computed (GenerationConfig's STRATEGIES list says what each is). `choose_strategy` turns
config.strategy into the one that runs ("auto" into the fastest exact path this model and machine support) and
refuses, in one line, a strategy that cannot apply. `one_token_step` builds the step of a one-token strategy and
`resources` the per-generation resources its passes use (packed weights, the thread count).
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Callable

import torch

from .compiled import CompiledStep, compiler_usable
from .config import GenerationConfig
from .graphs import GraphedStep
from .threads import decode_threads


def choose_strategy(model, config: GenerationConfig, logits_callback=None) -> str:
    """The strategy this generation runs: config.strategy, or for "auto" the fastest exact path that applies."""
    strategy = config.strategy
    why_not_fused = model.why_not_fused()
    if strategy == "auto":
        return "plain" if why_not_fused else "fused"
    if strategy in ("fused", "compiled") and why_not_fused:
        raise ValueError(f"strategy {strategy!r} cannot run this model: {why_not_fused}; use 'plain' or 'auto'")
    if strategy == "compiled":
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise ValueError(f"strategy 'compiled' compiles the CPU step; the model is on {device}: use 'graph' or "
                             "'auto'")
        if not compiler_usable():
            return "fused"  # an earlier compile failed in this process (it warned then)
    if strategy == "speculative" and logits_callback is not None:
        raise ValueError("strategy 'speculative' scores several positions per pass, not one at a time: it takes no "
                         "logits_callback; choose another strategy")
    return strategy


def one_token_step(dec, strategy: str) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """step(tokens (B, N), i) -> logits (rows, V) of image position i, given the committed tokens 0..i-1.
    Built after the prefill (the fused and graph steps start from the caches it wrote)."""
    if strategy == "uncached":
        return lambda tokens, i: dec.full(tokens[:, :i])
    if strategy == "plain":
        return lambda tokens, i: dec.step_at(tokens[:, i - 1:i], i - 1)
    if strategy == "graph":
        graphed = GraphedStep(dec, 1)
        return lambda tokens, i: graphed(tokens[:, i - 1:i], torch.full_like(tokens[:, :1], i - 1))[:, 0]
    fused = dec.model.fused_step(dec.caches, dec.rows)
    if strategy == "compiled":
        fused = CompiledStep(dec.model, fused)

    def step(tokens: torch.Tensor, i: int) -> torch.Tensor:
        dec.calls += 1
        x = dec.embed(tokens[:, i - 1:i], i - 1)
        return fused(x.view(dec.rows, -1), dec.T + i)  # image token i - 1 sits at sequence position T + 1 + (i - 1)
    return step


@contextmanager
def resources(model, strategy: str, rows: int):
    """What the passes of a generation hold while it runs: weights packed once for their row count (the module path
    and the fused step multiply with them; the compiled graph has its own frozen copies) and, for few rows, one
    intra-op thread where OpenMP threads sleep between ops (threads.py). Uncached passes take neither."""
    if strategy == "uncached":
        yield
        return
    with ExitStack() as stack:
        if strategy != "compiled":
            stack.enter_context(model.packed_weights(rows))
        stack.enter_context(decode_threads(rows))
        yield
