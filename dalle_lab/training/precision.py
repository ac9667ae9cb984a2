"""Which mixed precision `--amp` means on the device in use, in one place.

- CPU: bfloat16 autocast (the only low-precision type CPU kernels and DeepSpeed support there) where the processor
  computes bfloat16 natively (avx512_bf16 or AMX); elsewhere (e.g. AVX2-only processors) `auto` means float32,
  because emulated bfloat16 products are many times slower than float32 ones there (docs/training.md;
  lab/perf/results/train_step_precision.json). `--amp_dtype bf16` still forces it.
- CUDA: bfloat16 where the GPU computes it natively (compute capability 8.0 and newer), otherwise float16 with
  dynamic loss scaling (GradScaler): older GPUs only emulate bfloat16.
Weights stay float32 in every case: there is no bare `.half()` anywhere, so no path trains fp16 without a scaler.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from dalle_lab.utils import cpu_has_native_bf16, cuda_has_native_bf16

AMP_DTYPES = ("auto", "bf16", "fp16")


@dataclass(frozen=True)
class Precision:
    device_type: str  # "cpu" or "cuda"
    dtype: str | None  # None (float32), "bf16" or "fp16"

    @property
    def needs_loss_scaling(self) -> bool:
        return self.dtype == "fp16"

    def autocast(self):
        import torch

        if self.dtype is None:
            return contextlib.nullcontext()
        torch_dtype = torch.bfloat16 if self.dtype == "bf16" else torch.float16
        return torch.autocast(device_type=self.device_type, dtype=torch_dtype)

    def grad_scaler(self):
        """A GradScaler for fp16 (dynamic loss scaling), else None."""
        import torch

        return torch.amp.GradScaler(self.device_type) if self.needs_loss_scaling else None


def resolve_precision(amp: bool, device, amp_dtype: str = "auto") -> Precision:
    import torch

    device_type = torch.device(device).type
    if amp_dtype not in AMP_DTYPES:
        raise ValueError(f"--amp_dtype {amp_dtype!r}: choose one of {', '.join(AMP_DTYPES)}")
    if not amp:
        return Precision(device_type, None)
    if device_type == "cpu":
        if amp_dtype == "fp16":
            raise ValueError("--amp_dtype fp16 is not supported on the CPU (no fp16 kernels); use bf16 (the default)")
        if amp_dtype == "auto" and not cpu_has_native_bf16():
            return Precision("cpu", None)  # float32: see the module docstring
        return Precision("cpu", "bf16")
    if device_type == "cuda":
        if amp_dtype == "auto":
            return Precision("cuda", "bf16" if cuda_has_native_bf16(device) else "fp16")
        return Precision("cuda", amp_dtype)
    raise ValueError(f"--amp is not supported on device type {device_type!r}; use cpu or cuda")
