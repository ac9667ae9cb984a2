"""A decode step with fixed shapes, captured once as a CUDA graph and replayed for every step.

On a GPU a decode step of a model this size is a few hundred tiny kernels, and launching them costs more than
running them; a CUDA graph launches the whole step at once. Capture needs every shape and address fixed: the
KV cache written by scatter at each row's positions (cache.py), attention over all cache slots
with a position mask (kv_len = max_len), and input buffers the caller copies into. Sampling stays outside the
graph (it is cheap and keeps its own RNG stream).

On the CPU `GraphedStep` runs the same fixed-shape step without capture, which is how its arithmetic is tested
against the module path (tests/test_generate_strategies.py); on a GPU, `lab/perf/run.py --device cuda`
measures it.
"""
from __future__ import annotations

import torch


class GraphedStep:
    """dec.step (decoder.Decoder) for inputs of shape (batch, n) over the whole cache: step(tokens, index)."""

    def __init__(self, dec, n: int):
        if dec.max_len < dec.T + dec.N + n:
            raise ValueError(f"GraphedStep needs Decoder(extra_len >= {n}): warm-up and capture write into slots "
                             "past the image")
        self.dec, device = dec, dec.text_ids.device
        self.tokens = torch.zeros(dec.batch, n, dtype=torch.long, device=device)
        self.graph = None
        if device.type != "cuda":
            return
        # Warm-up and capture run the step for real: point them at slack slots past the last image position,
        # which real steps overwrite before any query may see them.
        self.index = torch.full((dec.batch, n), dec.max_len - dec.T - 1 - n, device=device) + torch.arange(
            n, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):  # cuBLAS / SDPA pick their kernels outside the capture
                dec.step(self.tokens, self.index, kv_len=dec.max_len)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = dec.step(self.tokens, self.index, kv_len=dec.max_len)
        dec.calls -= 3  # warm-up and capture are not decode passes

    def __call__(self, tokens: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        if self.graph is None:
            return self.dec.step(tokens, index, kv_len=self.dec.max_len)
        self.tokens.copy_(tokens)
        self.index.copy_(index)
        self.graph.replay()
        self.dec.calls += 1
        return self.logits.clone()  # the next replay overwrites the graph's output buffer
