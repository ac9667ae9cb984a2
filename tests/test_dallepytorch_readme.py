"""DALLE-pytorch 1.6.6's README examples, with only the import line changed (and sizes shrunk so they run in a
second): the code its users already have runs here. The comments are the README's section names.
"""
from __future__ import annotations

import pytest
import torch


def test_train_vae():
    from dalle_lab import DiscreteVAE  # was: from dalle_pytorch import DiscreteVAE

    vae = DiscreteVAE(
        image_size=32,
        num_layers=2,
        num_tokens=64,
        codebook_dim=32,
        hidden_dim=16,
        num_resnet_blocks=1,
        temperature=0.9,
        straight_through=False,
    )
    images = torch.randn(4, 3, 32, 32)
    loss = vae(images, return_loss=True)
    loss.backward()
    assert loss.dim() == 0 and vae.codebook.weight.grad is not None


def test_train_dalle_with_the_vae_then_generate_prime_and_guide():
    from dalle_lab import DALLE, DiscreteVAE  # was: from dalle_pytorch import DiscreteVAE, DALLE

    torch.manual_seed(0)
    vae = DiscreteVAE(image_size=32, num_layers=2, num_tokens=64, codebook_dim=32, hidden_dim=16,
                      num_resnet_blocks=1, temperature=0.9)
    dalle = DALLE(
        dim=32,
        vae=vae,  # automatically infer (1) image sequence length and (2) number of image tokens
        num_text_tokens=100,
        text_seq_len=8,
        depth=2,
        heads=2,
        dim_head=16,
        attn_dropout=0.1,
        ff_dropout=0.1,
    )
    text = torch.randint(0, 100, (4, 8))
    images = torch.randn(4, 3, 32, 32)

    loss = dalle(text, images, return_loss=True)
    loss.backward()
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0

    images = dalle.generate_images(text)
    assert images.shape == (4, 3, 32, 32)

    img_prime = torch.randn(4, 3, 32, 32)  # "to prime with a starting crop of an image"
    images = dalle.generate_images(text, img=img_prime, num_init_img_tokens=(3 * 8))
    assert images.shape == (4, 3, 32, 32)

    loss = dalle(text, images, return_loss=True, null_cond_prob=0.2)  # "adjust text conditioning strength"
    loss.backward()
    images = dalle.generate_images(text, cond_scale=3.0)
    assert images.shape == (4, 3, 32, 32)

    images = dalle.generate_images(text, filter_thres=0.9)  # generate.py's --top_k 0.9
    assert images.shape == (4, 3, 32, 32)


def test_generate_texts(tmp_path):
    from dalle_lab import DALLE, DiscreteVAE
    from dalle_lab.tokenizers import train_bpe

    tokenizer = train_bpe(["a red circle", "a blue square"], 40, tmp_path / "v.model")
    vae = DiscreteVAE(image_size=16, num_layers=2, num_tokens=16, codebook_dim=8, hidden_dim=8)
    dalle = DALLE(dim=32, vae=vae, num_text_tokens=tokenizer.vocab_size, text_seq_len=8, depth=1, heads=2, dim_head=16)
    text_tokens, texts = dalle.generate_texts(tokenizer, "a red")  # "you may also want to generate text"
    assert text_tokens.shape == (1, 8) and texts[0].startswith("a red")


def test_taming_vqgan_takes_its_two_paths_and_without_them_says_so(tmp_path):
    from dalle_lab import VQGanVAE  # was: from dalle_pytorch import VQGanVAE
    from dalle_lab.vae import make_tiny_vqgan

    with pytest.raises(ValueError, match=r"VQGanVAE needs local files: VQGanVAE\(vqgan_model_path=.*vqgan_config_path"):
        VQGanVAE()  # DALLE-pytorch downloaded a VQGAN here; nothing downloads in dalle_lab
    model_path, config_path = make_tiny_vqgan(tmp_path, image_size=16, n_embed=32)
    vae = VQGanVAE(model_path, config_path)
    assert vae.get_codebook_indices(torch.rand(1, 3, 16, 16)).shape == (1, vae.fmap_size ** 2)


def test_openai_vae_without_its_files_says_which_are_needed():
    from dalle_lab import OpenAIDiscreteVAE

    with pytest.raises(ValueError, match=r"encoder.pkl and decoder.pkl .*OpenAIDiscreteVAE\('encoder.pkl'"):
        OpenAIDiscreteVAE()


def test_dallepytorch_only_switches_are_accepted_or_refused_in_one_line():
    from dalle_lab import DALLE

    fields = dict(dim=16, num_text_tokens=20, text_seq_len=4, depth=1, heads=2, dim_head=8, num_image_tokens=8,
                  image_fmap_size=2)
    DALLE(reversible=False, sparse_attn=False, optimize_for_inference=True, **fields)  # what train scripts pass
    with pytest.raises(ValueError, match=r"^reversible=True .* is not implemented"):
        DALLE(reversible=True, **fields)
    with pytest.raises(ValueError, match=r"^sparse_attn=True .* is not supported"):
        DALLE(sparse_attn=True, **fields)
