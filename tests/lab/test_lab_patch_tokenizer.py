"""The stand-in patch-codebook image tokenizer: fits, reconstructs Shapes images, round-trips through a file, and
trains inside the study like a VQGAN."""
import math

import pytest
import torch

from lab.studies.loss_weighting.patch_tokenizer import PatchCodebookTokenizer, fit_patch_tokenizer


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    path = tmp_path_factory.mktemp("patch") / "patch.pt"
    return fit_patch_tokenizer(path, num_tokens=64, n_images=200, iterations=4), path


def test_fit_gives_the_vqgan_interface_and_good_reconstructions(fitted):
    tokenizer, path = fitted
    from dalle_lab.data.shapes import ShapesDataset

    assert (tokenizer.num_tokens, tokenizer.fmap_size, tokenizer.image_seq_len, tokenizer.image_size) == (64, 8, 64, 32)
    images, _ = ShapesDataset("val", length=16).batch(range(16))
    ids = tokenizer.get_codebook_indices(images)
    assert ids.shape == (16, 64) and ids.dtype == torch.long and 0 <= int(ids.min()) and int(ids.max()) < 64
    recon = tokenizer.decode(ids)
    assert recon.shape == images.shape and 0.0 <= float(recon.min()) and float(recon.max()) <= 1.0
    psnr = 10 * math.log10(1 / float(((recon - images) ** 2).mean()))
    assert psnr > 18  # even 64 codes fit flat-coloured shapes well (a random codebook gives ~7 dB)
    assert ids.unique().numel() > 16  # many codes in use


def test_codebook_patch_decodes_to_itself_in_grid_order():
    codebook = torch.rand(5, 3 * 2 * 2)
    tokenizer = PatchCodebookTokenizer(codebook, patch=2, image_size=4)
    ids = torch.tensor([[0, 1, 2, 3], [4, 4, 0, 1]])
    images = tokenizer.decode(ids)
    assert torch.equal(tokenizer.get_codebook_indices(images), ids)  # exact patches map back to their codes
    top_right = images[0, :, 0:2, 2:4].reshape(3, 4)  # grid position 1 = row 0, column 1
    assert torch.allclose(top_right, codebook[1].view(3, 4))


def test_save_load_round_trip_and_identity(fitted, tmp_path):
    tokenizer, path = fitted
    loaded = PatchCodebookTokenizer.load(path)
    assert torch.equal(loaded.codebook, tokenizer.codebook)
    assert loaded.identity == tokenizer.identity and loaded.identity["kind"] == "patch_codebook"
    assert len(loaded.identity["sha256"]) == 64
    assert not any(p.requires_grad for p in loaded.parameters()) and not loaded.train().training
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a patch-codebook tokenizer"):
        PatchCodebookTokenizer.load(tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"\(B, 3, 32, 32\)"):
        loaded.get_codebook_indices(torch.rand(1, 3, 16, 16))


def test_study_run_with_the_patch_tokenizer(fitted, tmp_path):
    from lab.studies.loss_weighting import run as lw
    from dalle_lab.evaluate.shapes import EvalSettings

    _, path = fitted
    config = lw.StudyConfig(seeds=1, steps=3, batch_size=4, warmup_steps=1, dim=32, depth=1, heads=2, dim_head=16,
                            log_every_n_steps=1, workers=1, image_tokenizer="patch",
                            eval=EvalSettings(n_val=2, n_heldout=2, n_loss=4, batch_size=4),
                            runs_dir=str(tmp_path / "runs"), out_dir=str(tmp_path / "report"))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / lw.PATCH_TOKENIZER_FILE).write_bytes(path.read_bytes())  # skip the full-size fit
    spec = lw.resolve_image_tokenizer(config)
    assert spec["kind"] == "patch"
    result = lw.run_one(config, lw.Setting(1.0, 16), 0, spec)
    assert result["train"]["steps"] == 3 and result["image_tokenizer"]["sha256"] == PatchCodebookTokenizer.load(
        path).identity["sha256"]
    assert 0.0 <= result["eval"]["val"]["accuracy"] <= 1.0
