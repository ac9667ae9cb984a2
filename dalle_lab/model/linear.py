"""nn.Linear that can multiply with a weight packed once for the few-row products of cached generation.

During cached generation every layer multiplies only a handful of rows (batch size, or batch x window for
speculative decoding) by its weight, and the CPU GEMM behind F.linear reorders the whole weight into its blocked
layout on every call. Packing each weight once per generation (`packed_linears`) removes that work:
- float32: the layout PRODUCT_KINDS picks for the CPU and the step's row count (on AVX2 a weight prepacked for
  oneDNN's fp32 linear up to 32 rows; on AVX-512 and past 32 rows F.linear); the fused decode step (fused_step.py)
  multiplies the same way;
- bfloat16 (under CPU autocast, or a bf16 model): oneDNN's prepacked linear, which runs on AMX / avx512_bf16 where
  the CPU has them, and gives bit-identical results to F.linear in bfloat16 (it is the same kernel, minus the
  reorder; autocast's per-call float32 -> bfloat16 weight copy goes away too).
What each kernel costs is in docs/performance.md (lab/perf/decode_levers.py): bf16 prepacked is the clear
gain (the 16 products of a reference step at 4 rows 2.39 -> 1.42 ms, at 20 rows 3.00 -> 1.82 ms); float32
packing did not pay on the Zen 4 machine at load 19 (MKL packed 2.52 -> 2.69 ms) but oneDNN-prepacked fp32 did on
an AVX2 Zen 3 (3.05 -> 2.26 ms for the 17 products at 4 rows, lab/perf/step_profile.py). The transposed
product W @ x^T this class used before was slowest on the Xeon (3.86 ms) and is gone.
Same parameters and state_dict keys as nn.Linear, so it is a drop-in replacement; packing never changes them.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from dalle_lab.utils import cpu_has_native_bf16

# How a float32 product of a few rows multiplies by a weight, by row count: the first (max_rows, kind) entry with
# rows <= max_rows applies, F.linear past the last. Kinds: "linear" (F.linear's addmm with a transposed view of W),
# "wt" (addmm with a contiguous W^T copy), "onednn" (the weight prepacked once per generation for oneDNN's fp32
# linear). Chosen per CPU capability from side-by-side runs (docs/performance.md): on an AVX2 Zen 3 the 17
# products of a step at 4 rows took 3.05 ms with F.linear, 1.99-2.98 with W^T copies, 2.26-2.44 oneDNN-prepacked
# (lab/perf/step_profile.py), and whole generations with oneDNN beat W^T in 6 of 6 paired rounds. On AVX-512 CPUs
# F.linear's own layout wins whole generations: an idle Xeon with AMX, two threads, 0.34 s per 4 x 256 against
# 0.43 oneDNN-prepacked (lab/perf/results/run-full-cpu-20261205-1138.json), and a Zen 4, one thread, 0.70 against
# 0.77 (step-profile-20261205-1017.json). At 64 rows all three tie.
_BY_CAPABILITY: dict[str, tuple[tuple[int, str], ...]] = {"AVX2": ((32, "onednn"),), "AVX512": ()}
PRODUCT_KINDS: tuple[tuple[int, str], ...] = _BY_CAPABILITY.get(torch.backends.cpu.get_cpu_capability(),
                                                                 ((32, "onednn"),))


def product_kind(rows: int, device: torch.device | str = "cpu") -> str:
    """The float32 product kind for `rows`-row inputs: the CPU layouts only on the CPU; W^T copies where oneDNN is
    absent (the next best measured)."""
    kind = next((k for max_rows, k in PRODUCT_KINDS if rows <= max_rows), "linear")
    if torch.device(device).type != "cpu":
        return "linear"
    return "wt" if kind == "onednn" and not torch.backends.mkldnn.is_available() else kind


class FewRowProduct:
    """x (rows, in) -> x @ W^T + b in float32, with the weight laid out once as product_kind(rows) says (or as
    `kind` says)."""

    def __init__(self, linear: nn.Linear, rows: int, kind: str | None = None):
        w = linear.weight.detach()
        self.kind = product_kind(rows, w.device) if kind is None else kind
        self.bias = None if linear.bias is None else linear.bias.detach()
        if self.kind == "onednn":
            self.weight = torch.ops.mkldnn._reorder_linear_weight(w, rows)
        else:
            self.weight = w.t().contiguous() if self.kind == "wt" else w.t()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return torch.mm(x, self.weight) if self.bias is None else torch.addmm(self.bias, x, self.weight)


class PackedWeight:
    """The packed forms of one Linear's weight, made on first use per dtype, for inputs of `rows` rows."""

    def __init__(self, linear: nn.Linear, rows: int):
        self.linear, self.rows = linear, rows
        self.fp32 = self.bf16 = None
        # where the CPU has no native bf16, oneDNN refuses to prepack bf16 weights ("needs avx_ne_convert or
        # avx512bw, avx512vl and avx512dq") and bf16 products go through F.linear
        self.bf16_packable = cpu_has_native_bf16()

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        """The product, or None where no packed kernel applies (then the caller uses F.linear)."""
        w, b = self.linear.weight, self.linear.bias
        if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
            x = x.to(torch.bfloat16)
        if x.dtype == torch.bfloat16 and w.dtype in (torch.float32, torch.bfloat16) and self.bf16_packable:
            if self.bf16 is None:
                self.bf16 = _prepack_bf16(w, b, self.rows)
                self.bf16_packable = self.bf16 is not None
            if self.bf16 is not None:
                return torch.ops.mkldnn._linear_pointwise(x, self.bf16[0], self.bf16[1], "none", [], "")
            return None
        rows = x.numel() // x.shape[-1]
        if x.dtype == torch.float32 and w.dtype == torch.float32 and rows == self.rows:
            if self.fp32 is None:
                self.fp32 = FewRowProduct(self.linear, self.rows)
            if self.fp32.kind != "linear":
                return self.fp32(x.reshape(rows, x.shape[-1])).view(*x.shape[:-1], -1)
        return None


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and torch.backends.mkl.is_available()


def _prepack_bf16(w: torch.Tensor, b: torch.Tensor | None, rows: int):
    """(weight prepacked for oneDNN's bf16 linear, bf16 bias), or None where oneDNN refuses: a CPU without native
    bf16 that cpu_has_native_bf16 was told to treat as one (DALLE_LAB_CPU_BF16=1) falls back to F.linear."""
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w.detach().to(torch.bfloat16), rows)
    except RuntimeError:
        return None
    return packed, None if b is None else b.detach().to(torch.bfloat16)


class Linear(nn.Linear):
    packed: PackedWeight | None = None  # set only inside packed_linears()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.device.type == "cpu" and not torch.is_grad_enabled():
            out = self.packed(x)
            if out is not None:
                return out
        return F.linear(x, self.weight, self.bias)


@contextmanager
def packed_linears(model: nn.Module, rows: int, enabled: bool = True):
    """Within the block, every Linear of model (on the CPU) multiplies `rows`-row inputs with a packed weight.

    The packs are made from the weights as they are on entry and dropped on exit, so a model that trains between
    generations is never multiplied with stale weights (do not update weights inside the block)."""
    linears = [m for m in model.modules() if isinstance(m, Linear) and m.weight.device.type == "cpu"]
    if not enabled or not packing_available() or not linears:
        yield
        return
    for m in linears:
        m.packed = PackedWeight(m, rows)
    try:
        yield
    finally:
        for m in linears:
            m.packed = None
