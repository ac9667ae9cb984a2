"""The KL coefficient of the policy-gradient loss: fixed, or adapted so the KL to the starting model tracks a target.

Reward hacking (jpeg_compressibility drawing grey blobs whatever the caption) is the policy walking far from the
starting model. A fixed `kl_coef` is hard to choose: the KL it allows depends on the reward's scale and on how far
the run goes. The adaptive controller of Ziegler et al. (2019, "Fine-tuning language models from human
preferences"; PPO's adaptive-KL variant) instead fixes the budget: after each epoch, with the measured KL per image,

    error = clip(KL / target - 1, -0.2, 0.2)
    coef  = coef * (1 + error * images_this_epoch / horizon)

so the coefficient grows while the policy is over budget and shrinks while it is under, by at most 20 % per
`horizon` images (a proportional controller with a bounded step: one noisy epoch cannot swing it).
"""
from __future__ import annotations

import math

ERROR_CLIP = 0.2


class KLController:
    """Holds the current coefficient; `update(kl_per_image, n_images)` after every epoch. Without a target it is
    the fixed coefficient and `update` does nothing."""

    def __init__(self, coef: float, target: float | None = None, horizon: int = 512):
        if target is not None and (target <= 0 or coef <= 0 or horizon <= 0):
            raise ValueError(f"an adaptive KL controller needs target > 0, coef > 0 and horizon > 0 "
                             f"(got target={target}, coef={coef}, horizon={horizon})")
        self.coef, self.target, self.horizon = float(coef), target, horizon

    @property
    def adaptive(self) -> bool:
        return self.target is not None

    def update(self, kl_per_image: float, n_images: int) -> float:
        if self.adaptive and math.isfinite(kl_per_image):
            error = min(max(kl_per_image / self.target - 1.0, -ERROR_CLIP), ERROR_CLIP)
            self.coef *= 1.0 + error * n_images / self.horizon
        return self.coef

    def state_dict(self) -> dict:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict) -> None:
        self.coef = float(state["coef"])
