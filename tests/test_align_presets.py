"""Named alignment presets: each reproduces the configuration its measurement was made with, and explicit flags
still win over it."""
import json
from pathlib import Path

import pytest

from dalle_lab.align.__main__ import build_parser, parse_args
from dalle_lab.align.config import PRESETS, preset, to_dict

ROOT = Path(__file__).resolve().parents[1]
# run-specific fields of a recorded run that a preset does not fix: the seed and the evaluation's size and cadence
NOT_PRESET = {"seed"}
RENAMED = {"token_credit": "credit"}  # fields renamed since the run was recorded
# fields added since: the values that behave as the code of the recorded run did
ADDED = {"adv_std": "group", "drop_flat_groups": False, "guidance_grad": "both", "screen_samples": 0, "diversity_weight": 0.0}


@pytest.mark.parametrize("name, results",
                         [("jpeg_protected", "lab/studies/align/results/kl_sweep_jpeg_protected_96.json")])
def test_preset_is_the_configuration_that_was_measured(name, results):
    runs = json.loads((ROOT / results).read_text())["runs"]
    config = to_dict(preset(name))
    for run_name, run in runs.items():
        recorded = {RENAMED.get(k, k): v for k, v in run["config"].items()} | ADDED
        differing = {k: (v, config.get(k)) for k, v in recorded.items()
                     if k not in NOT_PRESET and not k.startswith("eval_") and config.get(k) != v}
        assert not differing, f"{run_name}: preset {name!r} differs from the measured run in {differing}"


def test_explicit_flags_win_over_the_preset():
    args = parse_args(build_parser(), ["--dalle_path", "model.pt", "--preset", "jpeg_protected", "--lr", "2e-4"])
    assert args.lr == 2e-4  # the explicit flag
    assert args.kl_coef == 0.03 and args.epochs == 96 and args.reward == PRESETS["jpeg_protected"]["reward"]


def test_unknown_preset_names_the_choices():
    with pytest.raises(ValueError, match="unknown preset 'jpeg'; choose from faithfulness, jpeg_protected"):
        preset("jpeg")
