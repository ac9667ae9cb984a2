"""How much of a low-precision reward's gain is real: the paired arithmetic (dalle_lab/precision/gap_stats.py) on
numbers worked by hand, and lab/studies/parity/finetune_gap.py's wiring on a tiny checkpoint with clip_score."""
import importlib
import json
import math
from pathlib import Path

import pytest
import torch

from dalle_lab.precision.gap_stats import paired_gains, seed_summary

ROOT = Path(__file__).resolve().parents[1]
T2 = 4.302652729911275  # Student's t, 97.5 % quantile, 2 degrees of freedom


def test_paired_gains_worked_by_hand():
    before = {"fp32": [1.0, 2.0, 3.0], "low": [1.1, 2.0, 3.0]}
    after = {"fp32": [2.0, 2.0, 4.0], "low": [2.3, 2.1, 4.0]}
    gains = paired_gains(before, after)
    assert gains["apparent"]["gain"] == pytest.approx((1.2 + 0.1 + 1.0) / 3)
    assert gains["apparent"]["se"] == pytest.approx(math.sqrt(0.6866666666666668 / 2) / math.sqrt(3))  # of 1.2, 0.1, 1.0
    assert gains["real"]["gain"] == pytest.approx(2 / 3)
    # artefact per image: (after gap) - (before gap) = 0.2, 0.1, 0.0 -> mean 0.1, sd 0.1, paired se 0.1 / sqrt(3)
    assert gains["artefact"]["gain"] == pytest.approx(0.1)
    assert gains["artefact"]["se"] == pytest.approx(0.1 / math.sqrt(3))
    with pytest.raises(ValueError, match="same images"):
        paired_gains(before, {"fp32": [1.0, 2.0], "low": [1.0, 2.0]})


def _gains(apparent, real):
    return {"apparent": {"gain": apparent, "se": 0.0}, "real": {"gain": real, "se": 0.0},
            "artefact": {"gain": apparent - real, "se": 0.0}}


def test_seed_summary_t_intervals_verdicts_and_pairing():
    per_seed = {"0": {"low": _gains(0.30, 0.20), "fp32": _gains(0.25, 0.25)},
                "1": {"low": _gains(0.40, 0.29), "fp32": _gains(0.10, 0.10)},
                "2": {"low": _gains(0.50, 0.38), "fp32": _gains(0.31, 0.31)}}
    summary = seed_summary(per_seed, "low", "fp32")
    apparent = summary["arms"]["low"]["apparent"]
    assert apparent["mean"] == pytest.approx(0.4)
    assert apparent["half_width"] == pytest.approx(T2 * 0.1 / math.sqrt(3))  # sd of 0.3, 0.4, 0.5 is 0.1
    assert apparent["verdict"] == "above zero"
    artefact = summary["arms"]["low"]["artefact"]  # 0.10, 0.11, 0.12
    assert artefact["mean"] == pytest.approx(0.11) and artefact["verdict"] == "above zero"
    assert summary["share_surviving"]["meaningful"]
    assert summary["share_surviving"]["value"] == pytest.approx(((0.20 + 0.29 + 0.38) / 3) / 0.4)
    # real gains paired by seed: -0.05, +0.19, +0.07 (not the difference of independent means' intervals)
    paired = summary["real_gain_low_minus_fp32_arm"]
    assert paired["mean"] == pytest.approx(0.07)
    assert paired["half_width"] == pytest.approx(T2 * 0.12 / math.sqrt(3))
    assert paired["verdict"] == "cannot tell from zero"
    # artefacts: 0.10, 0.11, 0.12 against the control's 0, 0, 0
    excess = summary["artefact_low_minus_fp32_arm"]
    assert excess["mean"] == pytest.approx(0.11) and excess["half_width"] == pytest.approx(T2 * 0.01 / math.sqrt(3))

    flat = {seed: {"low": _gains(g, g)} for seed, g in (("0", -0.1), ("1", 0.05), ("2", 0.1))}
    summary = seed_summary(flat, "low")
    assert summary["arms"]["low"]["apparent"]["verdict"] == "cannot tell from zero"
    assert not summary["share_surviving"]["meaningful"]
    assert "real_gain_low_minus_fp32_arm" not in summary


@pytest.fixture(scope="module")
def benchmark():
    return importlib.import_module("lab.studies.parity.finetune_gap")


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_dalle_checkpoint):
    return tiny_dalle_checkpoint


def _run(benchmark, checkpoint, out, *extra):
    argv = ["--dalle_path", str(checkpoint), "--reward", "clip_score", "--epochs", "1", "--prompts_per_epoch", "2",
            "--group_size", "2", "--batch", "4", "--n_eval", "6", "--n_calibration", "4", "--num_prompts", "8",
            "--threads", "1", "--runs_dir", str(out / "runs"), "--report_dir", str(out / "rep"), *extra]
    assert benchmark.main(argv) == 0
    return json.loads((out / "rep" / "finetune_gap_clip_score_tpu_default.json").read_text())


def test_an_unchanged_model_gains_exactly_nothing(benchmark, tiny_checkpoint, tmp_path):
    """lr 0 leaves the weights as they were, so with the same sampling noise before and after every image repeats:
    every gain is exactly zero. (Fresh noise after training would give evaluation noise instead.)"""
    results = _run(benchmark, tiny_checkpoint, tmp_path, "--lr", "0", "--seeds", "3", "--no_control")
    record = results["per_seed"]["3"]
    run = record["runs"]["reward in tpu_default"]
    assert run["after"]["scores"] == record["before"]["scores"]
    assert all(run["gains"][m]["gain"] == 0 for m in ("apparent", "real", "artefact"))
    # the two precisions did score differently, and the run scored its reward in tpu_default (the guard ran)
    assert record["before"]["scores"]["low"] != record["before"]["scores"]["fp32"]
    assert all("reward_gap_mean_diff" in h for h in record["histories"]["reward in tpu_default"])
    assert results["threads"] == 1 and results["git"]["commit"] and results["dalle_sha256"]


def test_seeds_train_apart_and_gains_come_from_the_stored_scores(benchmark, tiny_checkpoint, tmp_path):
    results = _run(benchmark, tiny_checkpoint, tmp_path, "--lr", "1e-2", "--seeds", "0", "1")
    assert results["per_seed"]["0"]["eval_seed"] != results["per_seed"]["1"]["eval_seed"]
    for seed, record in results["per_seed"].items():
        for label, run in record["runs"].items():
            assert run["gains"] == paired_gains(record["before"]["scores"], run["after"]["scores"])
    assert results["summary"]["seeds"] == ["0", "1"]
    assert "reward in fp32" in results["summary"]["arms"]
