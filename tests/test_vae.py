"""VQGanVAE against taming-transformers' own code paths, on tiny models saved in the published format."""
import subprocess
import sys

import pytest
import torch

from dalle_lab.vae import VQGanVAE, load_vae, make_tiny_vqgan
from dalle_lab.vae.taming_format import build_model, read_model_config


@pytest.fixture(scope="module", params=[False, True], ids=["VQModel", "GumbelVQ"])
def tiny(request, tmp_path_factory):
    ckpt, yaml = make_tiny_vqgan(tmp_path_factory.mktemp("vqgan"), gumbel=request.param)
    return ckpt, yaml, VQGanVAE(ckpt, yaml)


def taming_reference(ckpt, yaml):
    """The same checkpoint loaded the way taming itself does it (its own classes, its own state_dict)."""
    model = build_model(read_model_config(yaml))
    state = torch.load(ckpt, weights_only=True)["state_dict"]
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("loss.")})
    return model.eval()


def test_attributes_come_from_config(tiny):
    _, _, vae = tiny
    assert (vae.image_size, vae.fmap_size, vae.image_seq_len, vae.num_tokens) == (32, 8, 64, 64)
    assert not vae.training and not any(p.requires_grad for p in vae.parameters())
    torch.nn.Sequential(vae).train()  # a parent's .train() must not unfreeze the tokenizer
    assert not vae.training and not vae.model.encoder.training


def test_round_trip_matches_taming(tiny):
    ckpt, yaml, vae = tiny
    torch.manual_seed(0)
    images = torch.rand(3, 3, 32, 32)
    indices = vae.get_codebook_indices(images)
    assert indices.shape == (3, 64) and indices.dtype == torch.long
    assert indices.unique().numel() > 1  # the fixture spreads its codebook: a trivial all-one-code map would hide bugs
    decoded = vae.decode(indices)

    ref = taming_reference(ckpt, yaml)
    with torch.no_grad():
        h = ref.quant_conv(ref.encoder(images * 2 - 1))
        if vae.is_gumbel:
            # taming's quantizer samples Gumbel noise; the tokenizer takes the mode of the same logits
            _, _, _, logits = ref.quantize(h, return_logits=True)
            ref_indices = logits.argmax(1).reshape(3, -1)
            z_q = ref.quantize.get_codebook_entry(ref_indices.reshape(-1), (3, 8, 8, 32))
        else:
            z_q, _, (_, _, ref_indices) = ref.quantize(h)
            ref_indices = ref_indices.reshape(3, -1)
        ref_images = ((ref.decode(z_q) + 1) / 2).clamp(0, 1)
    assert torch.equal(indices, ref_indices)
    torch.testing.assert_close(decoded, ref_images, atol=1e-5, rtol=0)


def test_decode_soft_is_differentiable_and_matches_decode_on_one_hot(tiny):
    _, _, vae = tiny
    indices = torch.randint(0, vae.num_tokens, (2, vae.image_seq_len))
    one_hot = torch.nn.functional.one_hot(indices, vae.num_tokens).float()
    torch.testing.assert_close(vae.decode_soft(one_hot), vae.decode(indices), atol=1e-5, rtol=0)
    logits = torch.randn(2, vae.image_seq_len, vae.num_tokens, requires_grad=True)
    vae.decode_soft(logits.softmax(-1)).mean().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_rejects_bad_inputs(tiny):
    _, _, vae = tiny
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        vae.get_codebook_indices(torch.rand(1, 3, 32, 32) * 2 - 1)
    with pytest.raises(ValueError, match="32x32"):
        vae.get_codebook_indices(torch.rand(1, 3, 64, 64))
    with pytest.raises(ValueError, match="token ids"):
        vae.decode(torch.full((1, 64), 64))


def test_mismatched_config_and_checkpoint_names_both_files(tmp_path):
    ckpt_small, _ = make_tiny_vqgan(tmp_path / "a", n_embed=64)
    _, yaml_big = make_tiny_vqgan(tmp_path / "b", n_embed=128)
    with pytest.raises(ValueError) as error:
        VQGanVAE(ckpt_small, yaml_big)
    message = str(error.value)
    assert str(ckpt_small) in message and str(yaml_big) in message and "quantize.embedding.weight" in message
    ckpt_gumbel, _ = make_tiny_vqgan(tmp_path / "c", gumbel=True)
    with pytest.raises(ValueError, match="does not match"):
        VQGanVAE(ckpt_gumbel, yaml_big)


def test_identity_round_trip_and_hash_check(tmp_path):
    ckpt, yaml = make_tiny_vqgan(tmp_path, seed=1)
    vae = VQGanVAE(ckpt, yaml)
    identity = vae.identity
    assert identity["kind"] == "taming_vqgan" and len(identity["sha256"]) == 64
    again = load_vae(identity)
    images = torch.rand(2, 3, 32, 32)
    assert torch.equal(again.get_codebook_indices(images), vae.get_codebook_indices(images))
    make_tiny_vqgan(tmp_path, seed=2)  # a different tokenizer at the same path
    with pytest.raises(ValueError, match="different image tokenizer"):
        load_vae(identity)


def test_compat_import_leaves_no_fake_modules_behind():
    code = (
        "import sys, importlib.util\n"
        "from dalle_lab.vae.taming_compat import import_taming\n"
        "m = import_taming()\n"
        "assert hasattr(m, 'VQModel') and hasattr(m, 'GumbelVQ')\n"
        "assert 'pytorch_lightning.utilities.distributed' not in sys.modules\n"
        "assert ('torchvision' in sys.modules) == (importlib.util.find_spec('torchvision') is not None)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_import_dalle_lab_vae_is_light():
    code = "import sys, dalle_lab.vae; assert 'taming' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_load_vae_finds_the_shipped_tokenizer_by_hash_when_the_recorded_path_is_elsewhere(tmp_path):
    from dalle_lab.vae.default import shipped_paths

    ckpt, yaml = shipped_paths()
    if not ckpt.is_file():
        pytest.skip("no shipped default tokenizer in dalle_lab/assets")
    identity = dict(VQGanVAE(ckpt, yaml).identity, model_path=str(tmp_path / "other_machine" / "shapes_vqgan.ckpt"),
                    config_path=str(tmp_path / "other_machine" / "shapes_vqgan.yaml"))
    assert load_vae(identity).model_path == ckpt


@pytest.mark.parametrize("dataset", ["shapes", "emoji"])
def test_each_builtin_dataset_has_a_shipped_tokenizer_found_by_hash(dataset, tmp_path):
    from dalle_lab.vae.default import default_vae, shipped_paths

    ckpt, yaml = shipped_paths(dataset)
    vae = default_vae(cache_dir=tmp_path, dataset=dataset)  # shipped: nothing is trained into the cache
    assert vae.model_path == ckpt and (vae.image_size, vae.fmap_size, vae.num_tokens) == (32, 8, 512)
    assert not any(tmp_path.iterdir())
    moved = dict(vae.identity, model_path=str(tmp_path / "elsewhere.ckpt"), config_path=str(tmp_path / "x.yaml"))
    assert load_vae(moved).model_path == ckpt


def test_default_vae_names_the_datasets_it_knows():
    from dalle_lab.vae.default import default_vae

    with pytest.raises(ValueError, match="'mnist'.*shapes, emoji"):
        default_vae(dataset="mnist")
