"""Learning-rate schedule: linear warm-up from 0 (as CogView does), then cosine, linear or constant decay, or a
plateau rule that cuts the rate when the loss stops improving.

The schedule sets `lr` on the optimizer's param groups itself instead of wrapping torch's LambdaLR, so the very same
object drives a plain torch optimizer and the torch optimizer we hand to DeepSpeed (whose wrappers share its param
groups). Its whole state is a few numbers, so it round-trips through a `weights_only` checkpoint.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

DECAYS = ("cosine", "linear", "constant", "plateau")


@dataclass
class LRSchedule:
    base_lr: float
    warmup_steps: int = 0
    total_steps: int | None = None  # decay horizon for cosine/linear; None keeps the peak rate after warm-up
    decay: str = "cosine"
    min_lr_ratio: float = 0.1  # cosine/linear decay end at base_lr * min_lr_ratio
    plateau_factor: float = 0.5  # plateau: multiply the rate by this ...
    plateau_patience: int = 200  # ... after this many optimizer steps without a new best (smoothed) loss
    plateau_smoothing: float = 0.98  # EMA factor of the loss the plateau rule watches (single steps are noisy)

    def __post_init__(self):
        if self.decay not in DECAYS:
            raise ValueError(f"unknown lr decay {self.decay!r}: choose one of {', '.join(DECAYS)}")
        self.step_count = 0
        self.plateau_scale = 1.0
        self._ema = None
        self._best = math.inf
        self._bad_steps = 0

    def factor(self, step: int) -> float:
        """Multiplier of base_lr for optimizer step `step` (0-based), without the plateau scale."""
        if step < self.warmup_steps:
            # (step + 1) so the first update already moves the weights; reaches 1.0 at the end of warm-up
            return (step + 1) / self.warmup_steps
        if self.decay in ("constant", "plateau") or not self.total_steps:
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if self.decay == "cosine":
            shape = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            shape = 1.0 - progress
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * shape

    def current_lr(self) -> float:
        return self.base_lr * self.factor(self.step_count) * self.plateau_scale

    def apply(self, optimizer) -> float:
        """Write the rate for the coming optimizer step into every param group; returns it."""
        lr = self.current_lr()
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr

    def step(self, loss: float | None = None) -> None:
        """Call after each optimizer step (with its loss for the plateau rule)."""
        self.step_count += 1
        if self.decay != "plateau" or loss is None or not math.isfinite(loss):
            return
        a = self.plateau_smoothing
        self._ema = loss if self._ema is None else a * self._ema + (1 - a) * loss
        if self.step_count <= self.warmup_steps:
            return
        if self._ema < self._best * (1 - 1e-3):
            self._best, self._bad_steps = self._ema, 0
        else:
            self._bad_steps += 1
            if self._bad_steps >= self.plateau_patience:
                self.plateau_scale *= self.plateau_factor
                self._bad_steps = 0

    def state_dict(self) -> dict:
        return {
            "step_count": self.step_count,
            "plateau_scale": self.plateau_scale,
            "ema": self._ema,
            "best": self._best if math.isfinite(self._best) else None,
            "bad_steps": self._bad_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state["step_count"])
        self.plateau_scale = float(state["plateau_scale"])
        self._ema = state["ema"]
        self._best = math.inf if state["best"] is None else float(state["best"])
        self._bad_steps = int(state["bad_steps"])
