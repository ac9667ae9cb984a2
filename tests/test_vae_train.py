"""train_vae on tiny data: the loss falls, the checkpoint loads through VQGanVAE, resume continues the step count."""
import json

import pytest
import torch

from dalle_lab.vae import VQGanVAE
from dalle_lab.vae.codebook import EMACodebook, usage_stats
from dalle_lab.vae.train import VAETrainConfig, train_vae

TINY = dict(image_size=16, n_embed=32, embed_dim=8, z_channels=32, ch=32, ch_mult=(1, 2), num_res_blocks=1,
            batch_size=8, val_size=16, lr=3e-3, warmup_steps=2, val_every=0, sample_every=0, save_every=0,
            threads=1, progress=False, precision="fp32")


def losses(out_dir):
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def test_training_lowers_loss_writes_taming_checkpoint_and_resumes(tmp_path):
    out = tmp_path / "run"
    first = train_vae(VAETrainConfig(steps=12, out_dir=str(out), **TINY))
    assert first["step"] == 12 and first["steps_this_run"] == 12
    assert (out / "samples" / "step_000012.png").is_file()

    vae = VQGanVAE(first["checkpoint"], first["config"])  # the published-format loader
    assert (vae.image_size, vae.fmap_size, vae.num_tokens) == (16, 8, 32)
    images = torch.rand(2, 3, 16, 16)
    assert vae.decode(vae.get_codebook_indices(images)).shape == (2, 3, 16, 16)
    assert VQGanVAE(first["last"], first["config"]).num_tokens == 32  # the training checkpoint loads too

    resumed = train_vae(VAETrainConfig(steps=30, out_dir=str(out), **TINY))
    assert resumed["steps_this_run"] == 18 and resumed["step"] == 30
    history = losses(out)
    assert [h["step"] for h in history] == [12, 30]
    assert history[1]["val_mse"] < history[0]["val_mse"]  # reconstruction improved across the resume


def test_fresh_run_at_step_zero_is_worse_than_trained(tmp_path):
    # an untrained model (0 steps) vs 25 steps: the validation error must fall
    untrained = train_vae(VAETrainConfig(steps=0, out_dir=str(tmp_path / "a"), **TINY))
    trained = train_vae(VAETrainConfig(steps=25, out_dir=str(tmp_path / "b"), **TINY))
    assert trained["val_mse"] < 0.95 * untrained["val_mse"]


def test_gumbel_training_produces_a_loadable_gumbel_vq(tmp_path):
    result = train_vae(VAETrainConfig(steps=3, gumbel=True, out_dir=str(tmp_path), **TINY))
    vae = VQGanVAE(result["checkpoint"], result["config"])
    assert vae.is_gumbel and vae.num_tokens == 32


def test_resume_refuses_other_model_settings(tmp_path):
    train_vae(VAETrainConfig(steps=2, out_dir=str(tmp_path), **TINY))
    with pytest.raises(ValueError, match="n_embed"):
        train_vae(VAETrainConfig(steps=4, out_dir=str(tmp_path), **{**TINY, "n_embed": 64}))


def test_dead_codes_restart_from_recent_encoder_outputs():
    codebook = torch.zeros(8, 4)
    ema = EMACodebook(codebook, decay=0.9)
    z = torch.randn(16, 4)
    ema.update(z, torch.zeros(16, dtype=torch.long))  # everything maps to code 0: codes 1..7 are dead
    assert ema.restart_dead(z) == 7
    restarted = codebook[1:]
    assert all(any(torch.equal(row, candidate) for candidate in z) for row in restarted)
    assert ema.restart_dead(z) == 8  # a fresh window with no updates: all codes count as unused


def test_usage_stats():
    stats = usage_stats(torch.tensor([5, 5, 0, 0]))
    assert stats["codes_used"] == 2 and stats["usage"] == 0.5 and abs(stats["perplexity"] - 2) < 1e-5


class _ToyPerceptual(torch.nn.Module):
    """Stands in for a user's TorchScript LPIPS: any module (x, y) -> per-image distance."""

    def forward(self, x, y):
        return (x - y).abs().mean(dim=(1, 2, 3))


def test_discriminator_and_user_lpips_terms_train_and_resume(tmp_path):
    lpips_path = tmp_path / "lpips.pt2"
    torch.export.save(torch.export.export(_ToyPerceptual(), (torch.rand(2, 3, 16, 16), torch.rand(2, 3, 16, 16)),
                                          dynamic_shapes=({0: torch.export.Dim("batch")}, {0: torch.export.Dim("batch")})),
                      str(lpips_path))
    options = dict(TINY, disc_weight=0.1, disc_start=1, lpips_path=str(lpips_path), out_dir=str(tmp_path / "run"))
    first = train_vae(VAETrainConfig(steps=3, **options))
    state = torch.load(first["last"], weights_only=True)["state_dict"]
    assert any(k.startswith("loss.discriminator.") for k in state)  # stored like published checkpoints
    assert not any(k.startswith("loss.") for k in torch.load(first["checkpoint"], weights_only=True)["state_dict"])
    assert VQGanVAE(first["last"], first["config"]).num_tokens == 32  # loader drops the loss weights
    assert train_vae(VAETrainConfig(steps=4, **options))["steps_this_run"] == 1


def test_finite_datasets_are_read_in_seeded_epochs_and_resume_at_the_same_batch():
    from dalle_lab.vae.train import image_batches

    class Numbered:
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return torch.full((3, 2, 2), float(i)), "caption"

    cfg = VAETrainConfig(batch_size=4)
    stream = image_batches(Numbered(), cfg, start_step=0)
    seen = [int(v) for _ in range(5) for v in next(stream)[:, 0, 0, 0]]
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))  # whole epochs
    assert seen[:10] != seen[10:20]  # reshuffled per epoch
    resumed = image_batches(Numbered(), cfg, start_step=3)
    assert [int(v) for v in next(resumed)[:, 0, 0, 0]] == seen[12:16]


def test_training_groupnorms_compute_in_float32_with_taming_weights_and_keys():
    from dalle_lab.vae import taming_format
    from dalle_lab.vae.train import Float32GroupNorm, build_run, model_config

    cfg = VAETrainConfig(ch_mult=(1, 2), image_size=16, n_embed=16)
    run = build_run(cfg, torch.device("cpu"))
    swapped = [m for m in run.model.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert swapped and all(type(m) is Float32GroupNorm for m in swapped)
    plain = taming_format.build_model(model_config(cfg))
    assert plain.state_dict().keys() == run.model.state_dict().keys()  # the checkpoint format is taming's

    norm = swapped[0]
    reference = torch.nn.GroupNorm(norm.num_groups, norm.num_channels, norm.eps)
    reference.load_state_dict(norm.state_dict())
    x = torch.randn(2, norm.num_channels, 4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = norm(x.bfloat16())
    assert out.dtype == torch.float32  # not bf16, whatever autocast hands it
    torch.testing.assert_close(out, reference(x.bfloat16().float()))


def _photo_folder(root, n=12, size=20):
    """Random-noise 'photos' with captions (a VAE does not read the captions)."""
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    rng = torch.Generator().manual_seed(0)
    for i in range(n):
        pixels = (torch.rand(size, size, 3, generator=rng) * 255).to(torch.uint8).numpy()
        Image.fromarray(pixels).save(root / f"{i}.png")
        (root / f"{i}.txt").write_text(f"photo {i}\n")
    return root


def test_train_vae_command_on_a_folder_prints_held_out_psnr_speed_and_the_flags(tmp_path, capsys):
    import train_vae

    folder = _photo_folder(tmp_path / "photos")
    flags = ["--data", str(folder), "--image_size", "16", "--ch_mult", "1", "2", "--n_embed", "32", "--steps", "3",
             "--batch_size", "4", "--no-progress", "--threads", "1", "--out_dir", str(tmp_path / "vae"),
             "--val_every", "0", "--sample_every", "0", "--save_every", "0"]
    assert train_vae.main(flags) == 0
    out = capsys.readouterr().out
    # 12 images: a tenth (1) is held out; PSNR and the speed are reported with what they were measured on
    assert "reconstruction: PSNR " in out and " dB on 1 held-out images of " in out
    assert "s per 1000 steps (3 steps this run" in out
    assert f"--vqgan_model_path {tmp_path / 'vae' / 'vqgan.ckpt'} --vqgan_config_path" in out
    assert VQGanVAE(tmp_path / "vae" / "vqgan.ckpt", tmp_path / "vae" / "vqgan.yaml").image_size == 16


@pytest.mark.parametrize("flags,message", [
    (["--data", "no/such/folder"], "--data no/such/folder: no such folder"),
    (["--data", "photos", "--image_size", "50"], "--image_size 50 is impossible with --ch_mult 1 2 2: it downsamples "
                                                 "4x, so the size must be a multiple of 4"),
    (["--data", "photos", "--image_size", "4"], "--image_size 4 is impossible"),
    (["--data", "broken"], "none of the 3 images in"),
])
def test_train_vae_command_mistakes_are_one_line(tmp_path, capsys, monkeypatch, flags, message):
    import train_vae

    monkeypatch.chdir(tmp_path)
    _photo_folder(tmp_path / "photos", n=3)
    (tmp_path / "broken").mkdir()
    for i in range(3):  # files with an image name that hold no image
        (tmp_path / "broken" / f"{i}.jpg").write_bytes(b"not an image")
        (tmp_path / "broken" / f"{i}.txt").write_text("a caption")
    assert train_vae.main([*flags, "--steps", "1", "--no-progress", "--out_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("train_vae.py: error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()  # nothing written for a run that cannot start


def test_a_folder_trains_on_every_image_captions_or_not(tmp_path):
    """A tokenizer never reads captions: images without a .txt are trained on, not left out (and a folder with
    none is not refused); --image_folder is DALLE-pytorch's spelling of --data."""
    import train_vae

    from dalle_lab.vae.train_data import training_data

    folder = _photo_folder(tmp_path / "mixed", n=12)
    for i in range(0, 12, 2):
        (folder / f"{i}.txt").unlink()
    (folder / "._3.png").write_bytes(b"\x00\x05\x16\x07")  # a macOS resource fork: not an image, not counted
    train, val = training_data(VAETrainConfig(data=str(folder), image_size=8, val_size=512))
    assert len(train) + len(val) == 12 and len(val) == 1
    assert train.dataset.report.corrupt_image == []
    nocap = tmp_path / "nocap"
    nocap.mkdir()
    for i in range(2):
        (folder / f"{2 * i}.png").rename(nocap / f"{i}.png")
    train, val = training_data(VAETrainConfig(data=str(nocap), image_size=8))
    assert len(train) == 1 and len(val) == 1
    args = train_vae.build_parser().parse_args(["--image_folder", str(nocap)])
    assert args.data == str(nocap)
