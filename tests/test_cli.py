"""train_dalle.py and generate.py as a user runs them: defaults, end to end, errors, two processes."""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dalle_lab.model import DALLEConfig
from dalle_lab.training.cli import DERIVED_MODEL_FIELDS, build_train_parser, config_from_args
from dalle_lab.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
TINY_FLAGS = ["--dim", "32", "--depth", "1", "--heads", "2", "--dim_head", "16", "--null_cond_prob", "0",
              "--warmup_steps", "1", "--sample_every_n_steps", "0", "--log_every_n_steps", "1", "--no-progress"]


def vqgan_flags(tiny_vqgan):
    return ["--vqgan_model_path", str(tiny_vqgan[0]), "--vqgan_config_path", str(tiny_vqgan[1])]


def run(script, *args, env=None):
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, str(ROOT / script), *map(str, args)], capture_output=True, text=True,
                          env=environment, cwd=ROOT, timeout=300)


def script_main(script, *args):
    """A command line's main(argv) in this process (saves a fresh interpreter's imports; exit code returned)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(script.replace(".py", "_script"), ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main([str(a) for a in args])


def generate_main(*args):
    return script_main("generate.py", *args)


def test_flag_defaults_are_the_config_defaults():
    cfg, overrides = config_from_args(build_train_parser().parse_args([]))
    model_defaults = DALLEConfig()
    for f in dataclasses.fields(DALLEConfig):
        if f.name in DERIVED_MODEL_FIELDS or f.name in ("num_text_tokens", "text_seq_len"):
            assert f.name not in overrides  # decided by the tokenizer / VAE / built-in dataset
        else:
            assert overrides[f.name] == getattr(model_defaults, f.name), f.name
    assert cfg == TrainConfig()


def test_text_context_is_the_datasets_unless_given():
    from dalle_lab.training.run_setup import dataset_model_defaults

    assert dataset_model_defaults(TrainConfig()) == {}  # Shapes: DALLEConfig's own default (12)
    assert dataset_model_defaults(TrainConfig(dataset="emoji")) == {"text_seq_len": 24}
    assert dataset_model_defaults(TrainConfig(dataset="emoji", image_text_folder="data")) == {}
    _, overrides = config_from_args(build_train_parser().parse_args(["--text_seq_len", "16"]))
    assert overrides["text_seq_len"] == 16


def test_dalle_pytorch_style_flags():
    args = build_train_parser().parse_args(
        ["--distributed_backend", "deepspeed", "--lr_decay", "--amp", "--stable", "--loss_img_weight", "1",
         "--resume", "--sample_captions", "a red circle| a blue square", "--local_rank", "1"])
    cfg, overrides = config_from_args(args)
    assert cfg.deepspeed and cfg.amp and cfg.lr_decay == "plateau" and cfg.resume == "latest"
    assert cfg.sample_captions == ["a red circle", "a blue square"]
    assert overrides["stable"] is True and overrides["loss_img_weight"] == 1.0


def test_train_then_generate_end_to_end(tiny_vqgan, tmp_path, capsys):
    out = tmp_path / "run"
    assert script_main("train_dalle.py", *vqgan_flags(tiny_vqgan), *TINY_FLAGS, "--max_steps", "2", "--batch_size",
                       "2", "--output_dir", out, "--sample_every_n_steps", "2") == 0
    checkpoint = out / "dalle.pt"
    assert f"checkpoint: {checkpoint}" in capsys.readouterr().out
    assert (out / "samples" / "step00000002.png").is_file()

    # generate.py as a real process: the script itself, run from the command line

    images = tmp_path / "images"
    generated = run("generate.py", "--dalle_path", checkpoint, "--text", "a red circle|a blue square",
                    "--num_images", "3", "--batch_size", "2", "--seed", "1", "--outputs_dir", images,
                    "--attention_maps")
    assert generated.returncode == 0, generated.stderr
    for caption in ("a_red_circle", "a_blue_square"):
        assert sorted(p.name for p in (images / caption).iterdir()) == ["0.png", "1.png", "2.png", "attention",
                                                                         "grid.png"]
        assert list((images / caption / "attention").glob("*.png"))
    records = [json.loads(line) for line in (images / "manifest.jsonl").read_text().splitlines()]
    assert len(records) == 6 and records[0]["caption"] == "a red circle" and records[0]["top_k"] == 10
    assert all((images / r["file"]).is_file() for r in records)

    assert generate_main("--dalle_path", checkpoint, "--text", "a red circle " * 30, "--outputs_dir",
                         tmp_path / "x") == 1
    assert "tokens long" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--batch_size", "0"], "--batch_size must be at least 1, got 0"),
    (["--epochs", "0"], "--epochs must be at least 1, got 0"),
    (["--epochs", "-1"], "--epochs must be at least 1, got -1"),
    (["--max_steps", "0"], "--max_steps must be at least 1, got 0"),
    (["--ga_steps", "0"], "--ga_steps must be at least 1, got 0"),
    (["--log_every_n_steps", "0"], "--log_every_n_steps must be at least 1, got 0"),
])
def test_a_zero_batch_or_budget_is_a_one_line_usage_error_before_anything_is_built(tmp_path, capsys, flags,
                                                                                   message):
    """A zero batch divided by zero in the batches; a zero budget wrote an untrained checkpoint as if trained."""
    out = tmp_path / "run"
    # the flag under test last, so it wins; --max_steps 1 keeps a regression from training for long
    assert script_main("train_dalle.py", *TINY_FLAGS, "--max_steps", "1", *flags, "--output_dir", out) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"train_dalle.py: error: {message}")
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_generate_reports_missing_and_foreign_checkpoints(tmp_path, capsys):
    assert generate_main("--dalle_path", tmp_path / "nope.pt", "--text", "a red circle") == 1
    assert "does not exist" in capsys.readouterr().err
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {}}, foreign)
    assert generate_main("--dalle_path", foreign, "--text", "a red circle") == 1
    assert "not a dalle_lab DALLE checkpoint" in capsys.readouterr().err


def test_generate_reports_a_vocab_larger_than_the_model(tiny_vqgan, tmp_path, capsys):
    from dalle_lab.model import DALLE
    from dalle_lab.tokenizers import get_tokenizer
    from dalle_lab.training import checkpoint as ckpt_io
    from dalle_lab.vae import VQGanVAE

    vae = VQGanVAE(*tiny_vqgan)
    small = DALLE(vae=vae, dim=16, depth=1, heads=1, dim_head=16, num_text_tokens=10)
    path = tmp_path / "small.pt"
    ckpt_io.save_checkpoint(ckpt_io.make_checkpoint(config=small.config.to_dict(),
                                                    tokenizer_identity=get_tokenizer().identity,
                                                    vae_identity=vae.identity,
                                                    model=ckpt_io.model_state_without_vae(small)), path)
    assert generate_main("--dalle_path", path, "--text", "a red circle", "--outputs_dir", tmp_path / "x") == 1
    assert "num_text_tokens" in capsys.readouterr().err


@pytest.mark.skipif(os.environ.get("DALLE_LAB_SLOW_TESTS") != "1",
                    reason="starts two processes with torchrun (~30 s on 2 cores); set DALLE_LAB_SLOW_TESTS=1")
def test_two_processes_match_one_with_the_same_global_batch(tiny_vqgan, tmp_path):
    from dalle_lab.training.loop import train

    one = train(TrainConfig(vqgan_model_path=str(tiny_vqgan[0]), vqgan_config_path=str(tiny_vqgan[1]),
                            batch_size=4, max_steps=3, warmup_steps=1, output_dir=str(tmp_path / "one"),
                            sample_every_n_steps=0, progress=False, log_every_n_steps=1, amp=False),
                dict(dim=32, depth=1, heads=2, dim_head=16, null_cond_prob=0.0))
    two = tmp_path / "two"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(ROOT / "train_dalle.py"),
         *vqgan_flags(tiny_vqgan), *TINY_FLAGS, "--max_steps", "3", "--batch_size", "2", "--output_dir", two,
         "--no-amp"],  # float32: bf16 rounding would hide the comparison behind its own noise
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("checkpoint:") == 1  # only rank 0 reports (and writes)
    losses = [json.loads(line)["loss"] for line in (two / "dalle-metrics.jsonl").read_text().splitlines()]
    # the same samples split rank-strided, gradients averaged: equal up to float32 reduction order
    assert losses == pytest.approx([h["loss"] for h in one.history], abs=1e-5)
    a = torch.load(one.checkpoint_path, weights_only=True)["model"]
    b = torch.load(two / "dalle.pt", weights_only=True)["model"]
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-5)
