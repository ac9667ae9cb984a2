"""The one-token decode step compiled by TorchInductor, weights frozen into the graph: opt-in (`compile=True`).

Why: at batch 4 the eager step (fused_step.py) is still about a hundred small ops, and its 4-row products run
oneDNN / MKL kernels built for large matrices. Inductor's max-autotune on the CPU benchmarks its own C++ GEMM
templates for exactly these shapes against ATen's, with the weights frozen (so they can be prepacked once), and
fuses the LayerNorms, GELU and residual adds around the products. On an idle AVX2 Zen 3 a 4 x 256 generation of the reference model took 0.76 s
against 1.14 s for the eager fused step (medians of 3 rounds; 4.78x the peer's 3.30 s, against 2.91x;
benchmarks/perf/results/run-full-cpu-20261203-1646.json). Its logits agree with the eager path's to float
rounding (the products add up in another order), so a token can differ where two candidates tie to rounding; the
tests and the benchmark compare the sampled tokens.

The step has static shapes, as in gpt-fast: the KV buffers are the Decoder's own (preallocated to the full
length by the prefill), the new keys/values are written at `pos` by index, and attention reads the whole buffer
under a position mask (so one graph serves every position; slots past `pos` are zeroed, as masked slots must be:
weight 0 times garbage NaN is still NaN). `pos` is a 0-d tensor, so no step recompiles.

What it costs: the first generation of a process took 57 s with an empty Inductor cache and 19-20 s with a warm
one (same file; Inductor keeps the generated C++ and the autotuning results on disk, in its cache directory,
TORCHINDUCTOR_CACHE_DIR, but frozen graphs are lowered again in every process). At 0.38 s saved per batch of 4
it pays from about 50 batches in a process with a warm cache, 150 with a cold one. Frozen weights mean stale weights if
the model changes, so every generation first checks the weights (storage, version counter and a float64 sum per
tensor) and compiles anew when they moved, at most MAX_BUILDS_PER_MODEL times (each build keeps its frozen copy of
the weights in memory for the life of the process): for inference, not for a model that trains between
generations (the alignment add-on does not use it). Each new row count (a smaller last batch, guidance doubling
the rows) compiles one more graph. Where Inductor cannot compile (no C++ compiler, an unsupported build, its
recompile limit) the decoder warns once and keeps the eager fused step for the rest of the process.

Supported: what fused_supported accepts (the default model, `stable`, `sandwich_norm`, shared ids, tied
embeddings), in float32 on the CPU; everything else keeps the eager paths.
"""
from __future__ import annotations

import types
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from .fused_step import FusedStep, fused_supported

# mode="max-autotune" is the setting measured (docs/performance.md); tests turn it off for cheaper compiles.
MAX_AUTOTUNE = True
_COMPILED: "weakref.WeakKeyDictionary[nn.Module, _Compiled]" = weakref.WeakKeyDictionary()
_FAILED = False  # set once a compile has failed in this process: later generations go straight to the fused step


def compiled_supported(model, x_dtype: torch.dtype = torch.float32) -> bool:
    return (not _FAILED and fused_supported(model, x_dtype) and model.final_norm.weight.device.type == "cpu")


def _linear(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, linear.weight, linear.bias)  # not linear(x): dalle_lab's Linear may hold an eager pack


def _norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def _step(model, x: torch.Tensor, pos: torch.Tensor, buffers: list[torch.Tensor]) -> torch.Tensor:
    """x (rows, dim), pos (0-d int64), buffers [(2, rows, heads, max_len, d)] per layer -> image logits (rows, V):
    the function of Transformer.forward for one new token per row, all rows at sequence position pos."""
    t = model.transformer
    rows = x.shape[0]
    for block, buffer in zip(t.layers, buffers):
        qkv = _linear(block.attn.to_qkv, _norm(block.attn_norm, x)).view(rows, 3, t.heads, t.dim_head)
        buffer.index_copy_(3, pos.view(1), qkv[:, 1:].transpose(0, 1).unsqueeze(3))
        visible = (torch.arange(buffer.shape[3], device=x.device) <= pos).view(1, 1, 1, -1)
        attn = F.scaled_dot_product_attention(qkv[:, :1].transpose(1, 2), buffer[0], buffer[1],
                                              attn_mask=visible).reshape(rows, t.heads * t.dim_head)
        out = _linear(block.attn.to_out, attn)
        out = _norm(block.attn_out_norm, out) if block.sandwich_norm else out
        x = x + (out if block.attn_scale is None else out * block.attn_scale)
        value, gate = _linear(block.ff.proj_in, _norm(block.ff_norm, x)).chunk(2, dim=-1)
        out = _linear(block.ff.proj_out, value * F.gelu(gate))
        out = _norm(block.ff_out_norm, out) if block.sandwich_norm else out
        x = x + (out if block.ff_scale is None else out * block.ff_scale)
    return _linear(model.to_image_logits, model._final(x))


def _fingerprint(model) -> tuple:
    """What the frozen graph was built from: each tensor's storage, version counter and float64 sum (the sum also
    catches writes through `.data`, which bypass the version counter; a write that keeps every sum, such as a
    permutation, would go unseen). Inference tensors keep no version counter."""
    tensors = list(model.parameters()) + list(model.buffers())
    sums = torch.stack([p.detach().sum(dtype=torch.float64) for p in tensors]).tolist() if tensors else []
    return tuple((p.data_ptr(), -1 if p.is_inference() else p._version) for p in tensors), tuple(sums)


class _Compiled:
    """One model's compiled step, for the weights it had when built.

    TorchDynamo keeps compiled graphs on the function's code object and reuses one whenever its guards pass, and
    its guards check the model's identity and shapes, not its weights: a graph with the old weights frozen in
    would be reused after an in-place update. So every _Compiled compiles its own copy of _step's code object,
    and a weight change builds a new _Compiled (a fresh compile) instead of recompiling the old one."""

    def __init__(self, model, builds: int):
        self.fingerprint, self.builds = _fingerprint(model), builds
        step = types.FunctionType(_step.__code__.replace(), _step.__globals__, "_step")
        self.fn = torch.compile(step, mode="max-autotune" if MAX_AUTOTUNE else None, dynamic=False, fullgraph=True)

    def __call__(self, model, x, pos, buffers):
        # Freezing (weights as constants, which lets max-autotune prepack them) is read from Inductor's global
        # config when a graph compiles, and TorchDynamo may recompile on any call (a new row count, thread count or
        # inference mode): so it is on during every call, restored after (a plain attribute swap: config.patch
        # costs about 40 us a call).
        import torch._inductor.config as inductor_config

        before = inductor_config.freezing
        inductor_config.freezing = True
        try:
            return self.fn(model, x, pos, buffers)
        finally:
            inductor_config.freezing = before


# Each build keeps its frozen copy of the weights for the life of the process (Inductor holds on to the modules it
# generates), so a model whose weights keep changing stops being compiled after this many builds.
MAX_BUILDS_PER_MODEL = 3


def _compiled_for(model) -> _Compiled | None:
    """The model's compiled step, rebuilt when its weights changed since it was built; None once it changed too
    often (the caller decodes eagerly)."""
    entry = _COMPILED.get(model)
    if entry is not None and (entry.fn is None or entry.fingerprint == _fingerprint(model)):
        return entry if entry.fn is not None else None
    builds = 0 if entry is None else entry.builds
    if builds >= MAX_BUILDS_PER_MODEL:
        warnings.warn(f"the weights of this model changed after {builds} compiles of its decode step; every compile "
                      "keeps a frozen copy of the weights in memory, so it decodes eagerly from now on (compile=True "
                      "is for a model that no longer trains)", RuntimeWarning, stacklevel=4)
        entry.fn = None
        return None
    entry = _COMPILED[model] = _Compiled(model, builds + 1)
    return entry


def _compile_errors() -> tuple:
    """What a compile that cannot work raises (no C++ compiler, code Inductor cannot lower, the recompile limit):
    these fall back to the eager step; anything else (a bug, out of memory) propagates."""
    from torch._dynamo.exc import FailOnRecompileLimitHit, TorchDynamoException
    from torch._inductor.exc import CppCompileError, InductorError

    return TorchDynamoException, FailOnRecompileLimitHit, InductorError, CppCompileError


class CompiledStep:
    """step(x, pos) -> image logits (rows, V), like FusedStep, through the compiled graph (built at the first
    call of the first generation, then reused while the weights stay the same).

    Built once per generation, after the prefill: it zeroes the caches' unwritten slots (the mask hides them, the
    product with their weight 0 must not see garbage) and reads and writes the caches in place."""

    def __init__(self, model, caches, rows: int, start: int):
        """start: the first sequence position the steps will write (the prefill wrote 0..start-1)."""
        self.model, self.caches, self.rows = model, caches, rows
        for cache in caches:
            cache.buffer.narrow(3, start, cache.max_len - start).zero_()
        self.buffers = [cache.buffer for cache in caches]
        self.fallback = None
        try:
            self.compiled = _compiled_for(model)
        except Exception as err:  # noqa: BLE001 - torch.compile itself refused (a build or Python it does not support)
            self._fall_back(err)
            return
        if self.compiled is None:
            self.fallback = FusedStep(model, caches, rows)

    def _fall_back(self, err: Exception) -> None:
        global _FAILED
        _FAILED = True
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        warnings.warn(f"TorchInductor could not compile the decode step ({type(err).__name__}: {first_line}); "
                      "decoding with the eager fused step for the rest of this process (Inductor's CPU backend "
                      "needs a C++ compiler such as g++; or drop compile=True)", RuntimeWarning, stacklevel=3)
        _COMPILED.pop(self.model, None)
        self.fallback = FusedStep(self.model, self.caches, self.rows)

    def __call__(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        if self.fallback is not None:
            return self.fallback(x, pos)
        if pos >= self.caches[0].max_len:
            raise ValueError(f"KV cache overflow: writing position {pos} into a cache of {self.caches[0].max_len}")
        try:
            return self.compiled(self.model, x, torch.tensor(pos, device=x.device), self.buffers)
        except _compile_errors() as err:  # compiling precedes the graph's first write: the caches are intact
            self._fall_back(err)
            return self.fallback(x, pos)
