"""The strategy "compiled": the model's fused one-token step compiled by TorchInductor, weights frozen in.

Why: at batch 4 the eager fused step is still about a hundred small ops, and its 4-row products run oneDNN / MKL
kernels built for large matrices. Inductor's max-autotune on the CPU benchmarks its own C++ GEMM templates for
exactly these shapes against ATen's, with the weights frozen (so they can be prepacked once), and fuses the
LayerNorms, GELU and residual adds around the products. Its logits agree with the eager path's to float rounding
(the products add up in another order), so a token could differ where two candidates tie to rounding; the tests
and the benchmark compare the sampled tokens. Measured effect and cost: docs/performance.md ("The compiled step").

The step has static shapes, as in gpt-fast: the KV buffers are the generation's own (cache.py, preallocated and
zero-filled), the new keys/values are written at `pos` by index, and attention reads the whole buffer under a
position mask (one graph serves every position). `pos` is a 0-d tensor, so no step recompiles. The function
compiled is the model's `decode_step` (model/fused_step.py: the eager fused step's function, one definition).

What it costs: compiling makes the first generation of a process slow, slower with an empty Inductor cache than
with a warm one (Inductor keeps the generated C++ and the autotuning results on disk, in its cache directory,
TORCHINDUCTOR_CACHE_DIR, but frozen graphs are lowered again in every process), so it pays only over many
generations in one process (docs/performance.md has the break-even). Frozen weights mean stale weights if
the model changes, so every generation first checks the weights (storage, version counter and a float64 sum per
tensor) and compiles anew when they moved, at most MAX_BUILDS_PER_MODEL times (each build keeps its frozen copy of
the weights in memory for the life of the process): for inference, not for a model that trains between
generations (the alignment add-on does not use it). Each new row count (a smaller last batch, guidance doubling
the rows) compiles one more graph. Where Inductor cannot compile (no C++ compiler, an unsupported build, its
recompile limit) the decoder warns once and keeps the eager fused step for the rest of the process.

Supported: the models the fused step supports, in float32 on the CPU.
"""
from __future__ import annotations

import types
import warnings
import weakref

import torch
from torch import nn

# mode="max-autotune" is the setting measured (docs/performance.md); tests turn it off for cheaper compiles.
MAX_AUTOTUNE = True
_COMPILED: "weakref.WeakKeyDictionary[nn.Module, _Compiled]" = weakref.WeakKeyDictionary()
_FAILED = False  # set once a compile has failed in this process: later generations go straight to the fused step


def compiler_usable() -> bool:
    """Whether to try compiling: no compile has failed in this process."""
    return not _FAILED


def _step(model, x: torch.Tensor, pos: torch.Tensor, io) -> torch.Tensor:
    return model.decode_step(x, pos, io)


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

    def __call__(self, model, x, pos, io):
        # Freezing (weights as constants, which lets max-autotune prepack them) is read from Inductor's global
        # config when a graph compiles, and TorchDynamo may recompile on any call (a new row count, thread count or
        # inference mode): so it is on during every call, restored after (a plain attribute swap: config.patch
        # costs about 40 us a call).
        import torch._inductor.config as inductor_config

        before = inductor_config.freezing
        inductor_config.freezing = True
        try:
            return self.fn(model, x, pos, io)
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
                      "keeps a frozen copy of the weights in memory, so it decodes eagerly from now on (strategy "
                      "'compiled' is for a model that no longer trains)", RuntimeWarning, stacklevel=4)
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
    """step(x, pos) -> image logits (rows, V), like the model's FusedStep, through the compiled graph (built at the
    first call of the first generation, then reused while the weights stay the same). Built once per generation,
    after the prefill; reads and writes the fused step's caches in place."""

    def __init__(self, model, fused):
        """fused: the model's FusedStep over this generation's caches (also the fallback)."""
        self.model, self.fused, self.fallback = model, fused, None
        try:
            self.compiled = _compiled_for(model)
        except Exception as err:  # noqa: BLE001 - torch.compile itself refused (a build or Python it does not support)
            self._fall_back(err)
            return
        if self.compiled is None:
            self.fallback = fused

    def _fall_back(self, err: Exception) -> None:
        global _FAILED
        _FAILED = True
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        warnings.warn(f"TorchInductor could not compile the decode step ({type(err).__name__}: {first_line}); "
                      "decoding with the eager fused step for the rest of this process (Inductor's CPU backend "
                      "needs a C++ compiler such as g++; or choose another strategy)", RuntimeWarning, stacklevel=3)
        _COMPILED.pop(self.model, None)
        self.fallback = self.fused

    def __call__(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        if self.fallback is not None:
            return self.fallback(x, pos)
        if pos >= self.fused.max_len:
            raise ValueError(f"KV cache overflow: writing position {pos} into a cache of {self.fused.max_len}")
        try:
            return self.compiled(self.model, x, torch.tensor(pos, device=x.device), self.fused.io)
        except _compile_errors() as err:  # compiling precedes the graph's first write: the caches are intact
            self._fall_back(err)
            return self.fallback(x, pos)
