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


@pytest.fixture(scope="session")
def tiny_dalle_checkpoint(tmp_path_factory):
    """A tiny random DALLE (tiny taming VQGAN of 32 codes, the shipped tokenizer) saved as a training checkpoint;
    its path. For tests that run a command line on a real checkpoint file (read it, never write beside it)."""
    from dalle_lab.model import DALLE
    from dalle_lab.tokenizers import get_tokenizer
    from dalle_lab.training.checkpoint import make_checkpoint, model_state_without_vae, save_checkpoint
    from dalle_lab.vae import VQGanVAE, make_tiny_vqgan

    directory = tmp_path_factory.mktemp("tiny_dalle")
    vae = VQGanVAE(*make_tiny_vqgan(directory, n_embed=32))
    tokenizer = get_tokenizer()
    torch.manual_seed(0)
    dalle = DALLE(vae=vae, dim=32, depth=1, heads=2, dim_head=16, num_text_tokens=tokenizer.vocab_size)
    path = directory / "dalle.pt"
    save_checkpoint(make_checkpoint(config=dalle.config.to_dict(), tokenizer_identity=tokenizer.identity,
                                    vae_identity=vae.identity, model=model_state_without_vae(dalle)), path)
    return path


@pytest.fixture(scope="session")
def other_data_checkpoint(tmp_path_factory):
    """A tiny random DALLE whose vocabulary is not the Shapes one (the shipped emoji vocabulary): a model of other
    data, for the commands that must not treat it as a Shapes model."""
    from dalle_lab.model import DALLE
    from dalle_lab.tokenizers import get_tokenizer
    from dalle_lab.training.checkpoint import make_checkpoint, model_state_without_vae, save_checkpoint
    from dalle_lab.vae import VQGanVAE, make_tiny_vqgan

    directory = tmp_path_factory.mktemp("other_data")
    vae, tokenizer = VQGanVAE(*make_tiny_vqgan(directory, n_embed=32)), get_tokenizer(None, dataset="emoji")
    dalle = DALLE(vae=vae, dim=32, depth=1, heads=2, dim_head=16, num_text_tokens=tokenizer.vocab_size)
    path = directory / "emoji.pt"
    save_checkpoint(make_checkpoint(config=dalle.config.to_dict(), tokenizer_identity=tokenizer.identity,
                                    vae_identity=vae.identity, model=model_state_without_vae(dalle)), path)
    return path
