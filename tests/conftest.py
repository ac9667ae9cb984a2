"""Shared test settings: small thread counts (CI has 2 cores and runs 2 test workers) and no network for wandb."""
import os

os.environ.setdefault("WANDB_MODE", "disabled")

import torch  # noqa: E402

torch.set_num_threads(1)
