"""The trainers' one resume rule (docs/training.md, 'One resume rule'): an output folder holding a run is continued
by the same command, whose first line says from where; a command that would make it another run is refused in one
line naming the difference and the two ways out; --overwrite starts afresh, deleting the old run's files. Also
align's base-checkpoint and reward check, and wandb in train_vae and align (off unless asked, imported lazily)."""
import json
import sys
import types

import pytest
import torch

from dalle_lab.align.__main__ import main as align_main
from dalle_lab.cli.train_dalle import main as train_dalle_main
from dalle_lab.cli.train_vae import main as train_vae_main

TINY_DALLE = ["--dim", "32", "--depth", "1", "--heads", "2", "--dim_head", "16", "--warmup_steps", "1",
              "--sample_every_n_steps", "0", "--log_every_n_steps", "1", "--no-progress", "--batch_size", "2"]
TINY_VAE = ["--image_size", "16", "--ch_mult", "1", "2", "--n_embed", "16", "--batch_size", "2", "--val_size", "4",
            "--val_every", "0", "--sample_every", "0", "--save_every", "0", "--threads", "1", "--no-progress"]
TINY_ALIGN = ["--epochs", "1", "--prompts_per_epoch", "2", "--group_size", "2", "--sample_batch_size", "4",
              "--train_batch_size", "4", "--threads", "1", "--eval_every", "0", "--eval_num_heldout", "0",
              "--eval_loss_images", "0", "--eval_diversity_samples", "0"]


def first_line(capsys) -> str:
    return capsys.readouterr().err.splitlines()[0]


def test_train_dalle_continues_its_folder_refuses_other_flags_and_overwrites_on_request(tiny_vqgan, tmp_path,
                                                                                      capsys):
    out = tmp_path / "run"
    flags = [*TINY_DALLE, "--vqgan_model_path", tiny_vqgan[0], "--vqgan_config_path", tiny_vqgan[1],
             "--output_dir", out]
    flags = list(map(str, flags))
    assert train_dalle_main([*flags, "--max_steps", "2"]) == 0
    capsys.readouterr()

    assert train_dalle_main([*flags, "--max_steps", "2"]) == 0  # the same command: continued (and already done)
    assert first_line(capsys) == (f"train_dalle.py: resuming {out / 'dalle.pt'} at step 2 (the run --output_dir "
                                  "holds; flags left out are taken from it, --overwrite starts afresh)")
    assert torch.load(out / "dalle.pt", weights_only=True)["step"] == 2

    assert train_dalle_main([*flags, "--max_steps", "3"]) == 1  # another run: refused, nothing touched
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max_steps 3 (saved: 2) (the LR decay horizon)" in err
    assert "give another --output_dir, or --overwrite to start afresh" in err
    other = tmp_path / "other.pt"
    other.write_bytes((out / "dalle.pt").read_bytes())
    assert train_dalle_main([*flags, "--dalle_path", str(other)]) == 1
    assert "--dalle_path starts another there" in capsys.readouterr().err

    assert train_dalle_main([*flags, "--max_steps", "3", "--overwrite"]) == 0
    assert first_line(capsys).startswith(f"train_dalle.py: --overwrite: a new run in {out} (")
    assert torch.load(out / "dalle.pt", weights_only=True)["step"] == 3
    steps = [json.loads(line)["step"] for line in (out / "dalle-metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]  # the old run's lines went with it
    assert train_dalle_main([*flags, "--resume", "--overwrite"]) == 2


def test_dalle_path_of_the_folders_own_checkpoint_without_the_model_flags_continues_the_run(tiny_vqgan, tmp_path,
                                                                                           capsys):
    """DALLE-pytorch's resume command names the checkpoint and leaves the model flags out: it is the same run, not a
    new one from the defaults' point of view written into the same folder."""
    out = tmp_path / "run"
    data = ["--vqgan_model_path", tiny_vqgan[0], "--vqgan_config_path", tiny_vqgan[1], "--output_dir", out,
            "--dalle_output_file_name", "mine", "--max_steps", "3", "--no-progress", "--batch_size", "2"]
    data = list(map(str, data))
    assert train_dalle_main([*map(str, TINY_DALLE), *data, "--time_budget_s", "0.001"]) in (0, 130)
    capsys.readouterr()
    saved = torch.load(out / "mine.pt", weights_only=True)
    assert train_dalle_main([*data, "--dalle_path", str(out / "mine.pt")]) == 0
    assert first_line(capsys) == (f"train_dalle.py: resuming {out / 'mine.pt'} at step {saved['step']} (the run "
                                  "--output_dir holds; flags left out are taken from it, --overwrite starts afresh)")
    steps = [json.loads(line)["step"] for line in (out / "mine-metrics.jsonl").read_text().splitlines()]
    assert saved["step"] < 3 and steps == sorted(set(steps))  # one run, continued: no step counted twice
    final = torch.load(out / "mine.pt", weights_only=True)
    assert final["step"] == 3 and final["config"]["dim"] == 32
    assert train_dalle_main([*data, "--dalle_path", str(out / "mine.pt"), "--dim", "64"]) == 1
    assert "--dim 64 (saved: 32)" in capsys.readouterr().err


def test_a_new_run_from_weights_takes_the_loss_weight_given_and_refuses_another_architecture(tiny_vqgan, tmp_path,
                                                                                              capsys):
    vq = ["--vqgan_model_path", str(tiny_vqgan[0]), "--vqgan_config_path", str(tiny_vqgan[1]), "--max_steps", "1"]
    assert train_dalle_main([*map(str, TINY_DALLE), *vq, "--output_dir", str(tmp_path / "a")]) == 0
    start = str(tmp_path / "a" / "dalle.pt")
    assert train_dalle_main([*vq, "--dalle_path", start, "--loss_img_weight", "1", "--batch_size", "2",
                             "--no-progress", "--output_dir", str(tmp_path / "b")]) == 0
    config = torch.load(tmp_path / "b" / "dalle.pt", weights_only=True)["config"]
    assert config["loss_img_weight"] == 1.0 and config["dim"] == 32 and config["depth"] == 1
    capsys.readouterr()
    assert train_dalle_main([*vq, "--dalle_path", start, "--dim", "64", "--batch_size", "2", "--no-progress",
                             "--output_dir", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err
    assert "another network than these flags ask for: --dim 64 (saved: 32)" in err and err.count("\n") <= 2


def test_train_vae_continues_its_folder_and_overwrite_starts_afresh(tmp_path, capsys):
    out = str(tmp_path / "vae")
    assert train_vae_main([*TINY_VAE, "--max_steps", "2", "--output_dir", out]) == 0
    assert first_line(capsys) == f"a new run in {out}"
    assert train_vae_main([*TINY_VAE, "--max_steps", "3", "--output_dir", out]) == 0
    assert first_line(capsys) == (f"resumed {tmp_path / 'vae' / 'last.ckpt'} at step 2 (the run {out} holds; "
                                  "--overwrite starts afresh)")
    assert train_vae_main([*TINY_VAE, "--max_steps", "1", "--output_dir", out, "--overwrite"]) == 0
    assert first_line(capsys).startswith(f"a new run in {out} (--overwrite: ")
    assert [json.loads(line)["step"] for line in (tmp_path / "vae" / "metrics.jsonl").read_text().splitlines()] == [1]

    assert train_vae_main([*TINY_VAE, "--output_dir", str(tmp_path / "empty"), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume: " in err and "holds no run to continue" in err
    assert train_vae_main([*TINY_VAE, "--output_dir", out, "--n_embed", "32"]) == 2  # another model there
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "n_embed: checkpoint 16 vs now 32" in err and "--overwrite" in err


@pytest.fixture
def align_args(tiny_dalle_checkpoint, tmp_path):
    prompts, eval_prompts = tmp_path / "prompts.txt", tmp_path / "eval_prompts.txt"
    prompts.write_text("a red circle\na blue square\n")
    eval_prompts.write_text("a green triangle\n")
    return ["--dalle_path", str(tiny_dalle_checkpoint), "--prompts", str(prompts), "--eval_prompts", str(eval_prompts),
            "--output_dir", str(tmp_path / "align"), *TINY_ALIGN]


def test_align_records_its_base_and_reward_and_refuses_another_in_the_same_folder(align_args, tmp_path, capsys):
    from dalle_lab.utils import file_sha256

    base = align_args[1]
    assert align_main(align_args) == 0
    recorded = json.loads((tmp_path / "align" / "run.json").read_text())
    assert recorded["base"] == {"path": base, "sha256": file_sha256(base)}
    assert recorded["reward"] == "jpeg_compressibility" and recorded["epoch"] == 1
    capsys.readouterr()

    assert align_main([*align_args, "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"[align] resumed {tmp_path / 'align' / 'align_state.pt'} at epoch 1 (4 images sampled): "
                          f"{base} (sha256 {file_sha256(base)[:12]}) on jpeg_compressibility")

    other = tmp_path / "other.pt"
    checkpoint = torch.load(base, weights_only=True)
    name = next(iter(checkpoint["model"]))
    checkpoint["model"][name] = checkpoint["model"][name] + 1
    torch.save(checkpoint, other)
    assert align_main([*align_args, "--dalle_path", str(other)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a run with another base checkpoint: " in err
    assert f"{file_sha256(base)[:12]}) on jpeg_compressibility there, {other} (sha256 {file_sha256(other)[:12]})" in err
    assert "give another --output_dir, or --overwrite to start afresh" in err
    assert align_main([*align_args, "--reward", "brightness"]) == 1
    assert "holds a run with another reward: " in capsys.readouterr().err

    assert align_main([*align_args, "--dalle_path", str(other), "--overwrite"]) == 0
    assert json.loads((tmp_path / "align" / "run.json").read_text())["base"]["path"] == str(other)
    assert [json.loads(line)["epoch"] for line in (tmp_path / "align" / "log.jsonl").read_text().splitlines()] == [0]


class FakeWandb:
    """A stand-in `wandb` module: what a trainer sends it."""

    def __init__(self):
        self.inits, self.logged, self.finished = [], [], 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        fake = self

        class Run:
            id = "run-7"

            def log(self, values, step):
                fake.logged.append((step, dict(values)))

            def finish(self):
                fake.finished += 1

        return Run()


def test_align_and_train_vae_log_to_wandb_only_when_asked(align_args, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails: a run without --wandb_name never does it
    assert align_main([*align_args, "--output_dir", str(tmp_path / "quiet")]) == 0
    assert train_vae_main([*TINY_VAE, "--max_steps", "1", "--output_dir", str(tmp_path / "vae_quiet")]) == 0

    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=fake.init))
    assert align_main([*align_args, "--wandb_name", "rl", "--wandb_project", "p"]) == 0
    assert fake.inits[0]["name"] == "rl" and fake.inits[0]["project"] == "p" and fake.inits[0]["id"] is None
    assert fake.inits[0]["config"]["base"]["sha256"] and fake.logged[0][0] == 1
    assert "reward_mean" in fake.logged[0][1] and fake.finished == 1
    assert align_main([*align_args, "--wandb_name", "rl", "--epochs", "2"]) == 0  # resumed: the same wandb run
    assert fake.inits[1]["id"] == "run-7" and fake.inits[1]["resume"] == "allow" and fake.logged[-1][0] == 2

    fake.logged.clear()
    assert train_vae_main([*TINY_VAE, "--max_steps", "2", "--output_dir", str(tmp_path / "vae"),
                           "--wandb_name", "vq"]) == 0
    assert fake.inits[2]["name"] == "vq" and [step for step, _ in fake.logged] == [1, 2, 2]
    assert "train/loss" in fake.logged[0][1] and "val_psnr" in fake.logged[-1][1]
    assert train_vae_main([*TINY_VAE, "--max_steps", "3", "--output_dir", str(tmp_path / "vae"),
                           "--wandb_name", "vq"]) == 0
    assert fake.inits[3]["id"] == "run-7"


def test_real_wandb_disabled_runs_offline_safe(align_args, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    assert train_vae_main([*TINY_VAE, "--max_steps", "1", "--output_dir", str(tmp_path / "vae"),
                           "--wandb_name", "vq"]) == 0
