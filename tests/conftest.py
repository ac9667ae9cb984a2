"""Shared test settings: small thread counts (CI has 2 cores and runs 2 test workers) and no network for wandb."""
import os

os.environ.setdefault("WANDB_MODE", "disabled")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_vqgan(tmp_path_factory):
    """A tiny random taming VQModel in the published checkpoint + yaml format, shared by the training tests."""
    from dalle_lab.vae.tiny import make_tiny_vqgan

    return make_tiny_vqgan(tmp_path_factory.mktemp("vqgan"))
