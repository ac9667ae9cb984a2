"""Issue 13: the in-run evaluation (eval prompts never RL prompts, weighted-sum terms logged, results file), the run
limits (a time budget alone runs until it; the log says which limit ended the run) and the adaptive KL controller."""
import json
import math

import pytest
import torch

from dalle_lab.align.config import DEFAULT_EPOCHS, AlignConfig
from dalle_lab.align.in_run_eval import diversity
from dalle_lab.align.prompts import default_eval_sets, split_rl_prompts
from dalle_lab.align.kl_control import KLController
from dalle_lab.data.shapes import heldout_captions, validation_captions
from dalle_lab.rewards import brightness, get_reward
from test_align_finetune import PROMPTS, make_trainer, tokenizer  # noqa: F401 (tokenizer is a fixture)

SMALL_EVAL = dict(eval_num_prompts=6,  # the first 4 are the RL PROMPTS: 2 stay
                  eval_num_heldout=2, eval_diversity_samples=3, eval_loss_images=0,
                  eval_temperature=1.0, eval_top_k=None, eval_cond_scale=1.0)


def test_epoch_limit_defaults_to_unlimited_under_a_time_budget():
    assert AlignConfig().max_epochs == DEFAULT_EPOCHS
    assert AlignConfig(time_budget_s=900).max_epochs == math.inf
    assert AlignConfig(time_budget_s=900, epochs=3).max_epochs == 3
    assert "whichever comes first" in AlignConfig(time_budget_s=900, epochs=3).limits_text()
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        AlignConfig(epochs=0)


@pytest.mark.parametrize("budget,expected", [(1e9, "stopped: epochs: 2 of --epochs 2"),
                                             (1e-6, "stopped: time budget")])
def test_the_log_says_which_limit_ended_the_run(tokenizer, tmp_path, budget, expected):
    lines = []
    trainer = make_trainer(tokenizer, tmp_path, epochs=2, inner_epochs=1, time_budget_s=budget)
    trainer.log_fn = lines.append
    trainer.train()
    assert any(line.startswith(f"[align] {expected}") for line in lines), lines
    assert any("runs for 2 epochs or" in line and "sampling" in line for line in lines)  # limits and sampler shown


def test_a_time_budget_without_epochs_runs_past_the_default_epoch_count(tokenizer, tmp_path, monkeypatch):
    trainer = make_trainer(tokenizer, tmp_path, epochs=None, time_budget_s=100.0, inner_epochs=1)
    trainer.train_epoch = lambda prompts: {"reward_mean": 0.0}
    trainer.save_state = trainer.plot_curve = lambda: None  # files are not the point here
    clock = iter(range(0, 10_000, 2))  # every perf_counter() call advances 2 s: each epoch takes 2 s
    monkeypatch.setattr("dalle_lab.align.trainer.time.perf_counter", lambda: float(next(clock)))
    history = trainer.train()
    assert len(history) == 50 > DEFAULT_EPOCHS  # 50 epochs x 2 s = the 100 s budget


def test_eval_prompts_are_never_sampled_as_rl_prompts(tokenizer, tmp_path):
    explicit = {"prompts": PROMPTS[:2]}
    assert split_rl_prompts(PROMPTS, explicit, log_fn=lambda _: None) == PROMPTS[2:]
    with pytest.raises(ValueError, match="every RL prompt is also an evaluation prompt"):
        split_rl_prompts(PROMPTS[:2], explicit, log_fn=lambda _: None)
    trainer = make_trainer(tokenizer, tmp_path, eval_sets=explicit, prompts_per_epoch=2)
    drawn = {p for epoch in range(30) for p in trainer.epoch_prompts(epoch)}
    assert drawn == set(PROMPTS[2:])
    # without an eval file: validation captions and held-out compositions, less whatever the user chose as RL prompts
    sets = default_eval_sets(AlignConfig(eval_num_prompts=8, eval_num_heldout=4), PROMPTS)
    assert sets["val"] == [p for p in validation_captions(8) if p not in PROMPTS] and len(sets["val"]) == 4
    assert sets["heldout"] == heldout_captions(4)
    assert default_eval_sets(AlignConfig(), ["a photo of a cat"]) == {}  # not Shapes captions: nothing to check


def test_in_run_eval_logs_each_weighted_sum_term_and_writes_the_results_file(tokenizer, tmp_path):
    reward = get_reward("brightness:2+negative_total_variation:0.5")
    trainer = make_trainer(tokenizer, tmp_path, reward=reward, epochs=2, eval_every=1, inner_epochs=1, **SMALL_EVAL)
    trainer.argv = ["--reward", "brightness:2+negative_total_variation:0.5"]
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [row["epochs_done"] for row in rows] == [0, 1, 2]  # before training, then every epoch
    for row in rows:
        for split in ("val", "heldout"):
            total = 2 * row[f"eval_{split}_reward_brightness"] + 0.5 * row[f"eval_{split}_reward_negative_total_variation"]
            assert row[f"eval_{split}_reward"] == pytest.approx(total, rel=1e-5)
            assert row[f"eval_{split}_reward_brightness_se"] > 0  # each term's gain can be judged on its own
            assert 0 <= row[f"eval_{split}_accuracy"] <= 1
    assert rows[0]["eval_val_kl_ref_image"] == pytest.approx(0.0, abs=1e-5)  # the start model is the reference
    assert rows[-1]["eval_val_kl_ref_image"] > 0
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert log[-1]["eval_heldout_reward"] == rows[-1]["eval_heldout_reward"]  # merged into the epoch's log line
    for row in log:  # the training epochs log each term too, and the terms add up to the epoch's reward
        total = 2 * row["reward_brightness"] + 0.5 * row["reward_negative_total_variation"]
        assert row["reward_mean"] == pytest.approx(total, rel=1e-5)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["start"] == rows[0] and results["final"] == rows[-1]
    assert results["command"][-1] == "brightness:2+negative_total_variation:0.5"
    assert results["stop_reason"].startswith("epochs") and results["config"]["eval_every"] == 1
    assert (tmp_path / "eval_curve.png").stat().st_size > 0


def test_diversity_of_identical_and_distinct_samples():
    tokens = torch.tensor([[1, 2], [1, 2], [3, 4]])
    images = torch.stack([torch.zeros(3, 2, 2), torch.zeros(3, 2, 2), torch.ones(3, 2, 2)])
    result = diversity(tokens, images)
    assert result["diversity_distinct"] == pytest.approx(2 / 3)
    assert result["diversity_pixel"] == pytest.approx(4 / 6)  # 2 of the 3 pairs differ by 1 everywhere


def test_adaptive_kl_controller_follows_ziegler_et_al():
    fixed = KLController(0.1)
    assert fixed.update(1e6, 64) == 0.1  # no target: the coefficient never moves
    ctl = KLController(0.1, target=10.0, horizon=512)
    assert ctl.update(11.0, 64) == pytest.approx(0.1 * (1 + 0.1 * 64 / 512))  # proportional inside the clip
    ctl = KLController(0.1, target=10.0, horizon=512)
    assert ctl.update(1000.0, 64) == pytest.approx(0.1 * (1 + 0.2 * 64 / 512))  # error clipped at +0.2
    assert ctl.update(0.0, 64) == pytest.approx(0.1 * (1 + 0.2 * 64 / 512) * (1 - 0.2 * 64 / 512))
    with pytest.raises(ValueError, match="kl_target needs a positive target"):
        AlignConfig(kl_target=5.0, kl_coef=0.0)


def test_adaptive_kl_coefficient_moves_in_a_run_and_resumes(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path, epochs=3, inner_epochs=1, kl_coef=0.05, kl_target=1e-6,
                           kl_horizon=6)
    history = trainer.train()
    coefs = [row["kl_coef"] for row in history]
    assert coefs[0] == 0.05 and coefs[1] == pytest.approx(0.05 * 1.2) and coefs[2] == pytest.approx(0.05 * 1.44)
    again = make_trainer(tokenizer, tmp_path, epochs=3, inner_epochs=1, kl_coef=0.05, kl_target=1e-6, kl_horizon=6)
    assert again.kl.coef == pytest.approx(0.05 * 1.2 ** 3)  # restored from align_state.pt


def test_a_run_without_a_start_evaluation_still_evaluates_at_the_end(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path, epochs=1, inner_epochs=1, eval_at_start=False, **SMALL_EVAL)
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [row["epochs_done"] for row in rows] == [1]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["start"] is None and results["final"] == rows[0]
