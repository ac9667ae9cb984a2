"""DeepSpeed on the CPU: bf16 steps, exact resume through the one checkpoint format (ZeRO shards included), and a
user's DeepSpeed config honoured. The shared-memory comm op is not compiled (see deepspeed_engine.py), so each
DeepSpeed start costs seconds, not a minute."""
import json

import pytest
import torch

pytest.importorskip("deepspeed")

from dalle_lab.tokenizers import DEFAULT_BPE_PATH  # noqa: E402
from dalle_lab.training.checkpoint import load_dalle  # noqa: E402
from dalle_lab.training.config import TrainConfig  # noqa: E402
from dalle_lab.training.deepspeed_engine import build_deepspeed_config  # noqa: E402
from dalle_lab.training.loop import train  # noqa: E402
from dalle_lab.training.precision import Precision, resolve_precision  # noqa: E402

TINY_MODEL = dict(dim=32, depth=1, heads=2, dim_head=16, null_cond_prob=0.0)


def ds_config(tiny_vqgan, output_dir, **overrides) -> TrainConfig:
    ckpt, yaml = tiny_vqgan
    settings = dict(vqgan_model_path=str(ckpt), vqgan_config_path=str(yaml), batch_size=4, max_steps=4,
                    warmup_steps=2, output_dir=str(output_dir), save_every_n_steps=0, sample_every_n_steps=0,
                    progress=False, log_every_n_steps=1, seed=5, deepspeed=True, amp=True)
    if overrides.get("image_text_folder"):  # a folder's run names its vocabulary (the shipped one: Shapes captions)
        overrides.setdefault("bpe_path", str(DEFAULT_BPE_PATH))
    settings.update(overrides)
    return TrainConfig(**settings)


def test_deepspeed_bf16_zero2_resumes_exactly_and_generates(tiny_vqgan, tmp_path):
    straight = train(ds_config(tiny_vqgan, tmp_path / "straight", zero_stage=2), TINY_MODEL)
    first = train(ds_config(tiny_vqgan, tmp_path / "split", zero_stage=2), TINY_MODEL, stop_at_step=2)
    second = train(ds_config(tiny_vqgan, tmp_path / "split", zero_stage=2, resume="latest"), TINY_MODEL)

    losses = [h["loss"] for h in straight.history]
    assert losses[-1] < losses[0]
    assert [h["loss"] for h in first.history + second.history] == pytest.approx(losses, abs=1e-6)
    a = torch.load(straight.checkpoint_path, weights_only=True)
    b = torch.load(second.checkpoint_path, weights_only=True)
    assert b["engine"] == "deepspeed" and b["deepspeed"]["zero_stage"] == 2
    for name, tensor in a["model"].items():
        assert tensor.dtype == torch.float32
        torch.testing.assert_close(b["model"][name], tensor, rtol=0, atol=1e-6)

    dalle, tokenizer, vae = load_dalle(second.checkpoint_path)  # consolidated weights: no DeepSpeed needed
    text = tokenizer.tokenize(["a red circle"], dalle.config.text_seq_len)
    tokens = dalle.generate_images(text, top_k=5, return_tokens=True)
    assert tokens.shape == (1, dalle.config.image_seq_len)


def test_user_deepspeed_config_is_honoured_not_overwritten(tiny_vqgan, tmp_path):
    user = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 0.25,
            "zero_optimization": {"stage": 1}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(user))
    result = train(ds_config(tiny_vqgan, tmp_path / "run", deepspeed_config=str(path), batch_size=8,
                             clip_grad_norm=1.0, max_steps=2), TINY_MODEL)
    ckpt = torch.load(result.checkpoint_path, weights_only=True)
    # the user's micro-batch 2 x accumulation 2 ran, not the --batch_size 8 flag
    assert ckpt["data_position"]["samples"] == 2 * 2 * 2
    assert ckpt["deepspeed"]["zero_stage"] == 1
    assert json.loads(path.read_text()) == user  # the file itself is untouched


def test_build_deepspeed_config_only_fills_what_is_missing():
    cpu_bf16 = Precision("cpu", "bf16")
    user = {"bf16": {"enabled": False}, "gradient_clipping": 0.1, "optimizer": {"type": "AdamW", "params": {"lr": 1}},
            "train_batch_size": 16, "train_micro_batch_size_per_gpu": 4}
    config = build_deepspeed_config(user, batch_size=64, ga_steps=1, world_size=2, clip_grad_norm=0.5,
                                    precision=cpu_bf16, zero_stage=2)
    assert config["bf16"] == {"enabled": False} and "torch_autocast" not in config  # the user chose precision
    assert config["gradient_clipping"] == 0.1
    assert config["train_micro_batch_size_per_gpu"] == 4 and config["gradient_accumulation_steps"] == 2
    assert config["optimizer"]["params"] == {"lr": 1, "torch_adam": True}  # no FusedAdam compile
    assert config["zero_optimization"] == {"stage": 2}
    assert user["optimizer"]["params"] == {"lr": 1}  # the caller's dict is not modified

    filled = build_deepspeed_config({}, batch_size=8, ga_steps=3, world_size=1, clip_grad_norm=0.5,
                                    precision=cpu_bf16)
    assert filled["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"}
    assert (filled["train_micro_batch_size_per_gpu"], filled["gradient_accumulation_steps"],
            filled["train_batch_size"]) == (8, 3, 24)
    assert filled["zero_optimization"]["stage"] == 0 and filled["gradient_clipping"] == 0.5
    cuda_fp16 = build_deepspeed_config({}, batch_size=8, ga_steps=1, world_size=1, clip_grad_norm=0,
                                       precision=Precision("cuda", "fp16"))
    assert cuda_fp16["fp16"] == {"enabled": True, "loss_scale": 0} and "gradient_clipping" not in cuda_fp16


def test_amp_means_bf16_on_cpu_and_refuses_fp16_there(monkeypatch):
    from dalle_lab.training import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert resolve_precision(True, "cpu") == Precision("cpu", "bf16")
    # without native bf16 (AVX2-only CPUs) auto means float32; an explicit bf16 is still honoured
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision(True, "cpu") == Precision("cpu", None)
    assert resolve_precision(True, "cpu", "bf16") == Precision("cpu", "bf16")
    assert resolve_precision(False, "cpu").dtype is None
    assert not resolve_precision(True, "cpu").needs_loss_scaling
    with pytest.raises(ValueError, match="fp16 is not supported on the CPU"):
        resolve_precision(True, "cpu", "fp16")


def test_zero3_shards_are_consolidated_into_full_weights(tiny_vqgan, tmp_path):
    result = train(ds_config(tiny_vqgan, tmp_path, zero_stage=3, max_steps=2), TINY_MODEL)
    ckpt = torch.load(result.checkpoint_path, weights_only=True)
    assert ckpt["deepspeed"]["zero_stage"] == 3
    dalle, _, _ = load_dalle(result.checkpoint_path)  # strict load: every weight present, full shape, float32
    assert all(t.dtype == torch.float32 and t.numel() > 0 for t in ckpt["model"].values())
    assert set(ckpt["model"]) == set(dalle.state_dict())


def test_the_lr_horizon_counts_the_deepspeed_configs_accumulation(tiny_vqgan, tmp_path):
    from test_training_resume import two_caption_folder

    folder = two_caption_folder(tmp_path / "data", n=6)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2}))
    result = train(ds_config(tiny_vqgan, tmp_path / "run", deepspeed_config=str(path), image_text_folder=str(folder),
                             max_steps=None, epochs=1, warmup_steps=1), TINY_MODEL)
    ckpt = torch.load(result.checkpoint_path, weights_only=True)
    # 6 micro-batches an epoch, 2 per optimizer step (the config's, not --ga_steps 1): the cosine ends at step 3
    assert result.step == 3 and ckpt["run"]["lr_total_steps"] == 3 and ckpt["run"]["ga_steps"] == 2
