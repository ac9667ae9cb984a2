"""The loss-weighting study at make demo's recipe (issue 39): the recipe per CPU kind, the powered two-object
evaluation's captions and outcome strings, and its paired answers worked out by hand."""
import math
from dataclasses import replace

import pytest

from dalle_lab.model import DALLEConfig
from dalle_lab.stats import detectable_effect
from dalle_lab.training.config import TrainConfig
from lab.studies.loss_weighting import one_word
from lab.studies.loss_weighting import run as lw
from lab.studies.loss_weighting.runs import run_identity, training_part
from lab.studies.loss_weighting.two_objects import TwoObjectEval, indicator, shares, two_object_captions


def test_the_demo_recipe_is_train_dalle_defaults_with_native_bf16_and_demo_sh_float32_elsewhere():
    bf16, fp32 = lw.StudyConfig(**lw.demo_recipe(True)), lw.StudyConfig(**lw.demo_recipe(False))
    train, model = TrainConfig(), DALLEConfig()
    assert (bf16.steps, bf16.batch_size, bf16.warmup_steps, bf16.amp) == (train.max_steps, train.batch_size,
                                                                          train.warmup_steps, True) == (1800, 64, 100, True)
    assert (fp32.steps, fp32.batch_size, fp32.warmup_steps, fp32.amp) == (1000, 32, 50, False)
    for config in (bf16, fp32):
        assert config.text_seq_lens == (model.text_seq_len,) and config.loss_img_weights == (1.0, 7.0)
        assert (config.dim, config.depth, config.heads, config.dim_head) == (model.dim, model.depth, model.heads,
                                                                             model.dim_head)
        assert config.learning_rate == train.learning_rate and config.seeds == 3 and config.caption_noise == 0
        assert config.workers == 1 and config.objects == TwoObjectEval()
        assert [t[1] for t in config.tasks()] == [0, 0, 1, 1, 2, 2]  # seed-major: w=1 and w=7 of a seed together
    assert bf16.out_dir != fp32.out_dir and bf16.runs_dir != fp32.runs_dir  # a CPU kind never mixes into the other


def test_recipe_flags_keep_its_evaluation_and_explicit_flags_win(monkeypatch):
    monkeypatch.setattr("dalle_lab.utils.cpu_has_native_bf16", lambda: True)
    args = lw.build_parser(recipe="demo").parse_args(["--recipe", "demo", "--steps", "5", "--two_object_val", "8",
                                                      "--only_seeds", "1"])
    config = lw.config_from_args(args)
    assert config.steps == 5 and config.batch_size == 64 and config.recipe == "demo (bf16)"
    assert (config.eval.top_k, config.eval.temperature, config.eval.cond_scale) == (10, 0.7, 2.0)
    assert config.objects == TwoObjectEval(n_val=8)
    assert config.tasks() == [(lw.Setting(1.0, 12), 1), (lw.Setting(7.0, 12), 1)]
    assert lw.main(["--recipe", "demo", "--only_seeds", "3"]) == 2  # seeds are 0..2: a clear error, no run


def test_two_object_captions_are_the_first_two_object_items_of_the_split():
    from dalle_lab.data.shapes import parse, split_of, validation_captions

    captions = two_object_captions("val", 12)
    assert captions == two_object_captions("val", 12)  # the same for every run
    assert all(len(parse(c).objects) == 2 and split_of(c) == "val" for c in captions)
    stream = [c for c in validation_captions(60) if len(parse(c).objects) == 2]
    assert captions == stream[:12]
    assert all(split_of(c) == "heldout" for c in two_object_captions("heldout", 5))


def test_the_default_sampling_is_generate_pys():
    from dalle_lab.generate import GenerationConfig
    from lab.studies.loss_weighting.two_objects import SAMPLINGS

    default = GenerationConfig()
    assert SAMPLINGS["default"] == (default.top_k, default.top_p, default.temperature, default.cond_scale)


def test_outcome_shares_and_indicators():
    assert shares(["BFSN", "BBNN"]) == {"both": 3 / 8, "first_only": 1 / 8, "second_only": 1 / 8, "neither": 3 / 8,
                                        "only_one": 2 / 8}
    assert [indicator(c, "only_one") for c in "BFSN"] == [0, 1, 1, 0]
    assert [indicator(c, "first_only") for c in "BFSN"] == [0, 1, 0, 0]


def test_the_two_object_evaluation_is_in_the_identity_only_when_it_runs_and_never_forces_retraining():
    study = lw.StudyConfig()
    plain = run_identity(study, lw.Setting(1.0, 16), 0, {}, {})
    assert "objects" not in plain  # the earlier studies' stored runs keep matching
    demo = lw.StudyConfig(**lw.demo_recipe(True))
    small, large = (run_identity(replace(demo, objects=TwoObjectEval(n_val=n)), lw.Setting(1.0, 12), 0, {}, {})
                    for n in (4, 400))
    assert small != large and training_part(small) == training_part(large)  # re-evaluated, not retrained


def _run(setting, seed, val, heldout=("BB", "BB")):
    return {"setting": setting.name, "seed": seed,
            "eval": {"two_objects": {"default": {"val": {"n_items": len(val[0]), "outcomes": list(val)},
                                                 "heldout": {"n_items": len(heldout[0]),
                                                             "outcomes": list(heldout)}}}}}


def test_paired_answers_by_seed_and_by_caption_worked_by_hand(monkeypatch):
    config = lw.StudyConfig(**{**lw.demo_recipe(True), "objects": TwoObjectEval(samplings=("default",))})
    low, high = lw.Setting(1.0, 12), lw.Setting(7.0, 12)
    # 4 items; items 0 and 2 are the same caption (a repeated draw of the validation stream)
    monkeypatch.setattr(one_word, "two_object_captions", lambda split, n, seed: ["a", "b", "a", "c"][:n]
                        if split == "val" else ["x", "y"][:n])
    results = [_run(low, 0, ("FFBN", "FSBN")), _run(high, 0, ("BFBN", "BBBN")),
               _run(low, 1, ("FNNN", "SNNN")), _run(high, 1, ("BNNN", "NNNN"))]
    answer = one_word.powered_one_word(config, results)
    entry = answer["by_sampling"]["default"]["val"]
    # seed 0: only-one share 4/8 (F F F S) vs 1/8 -> +0.375; seed 1: 2/8 vs 0 -> +0.25; t with 1 degree of freedom
    seed = entry["seed_paired"]["only_one"]
    assert seed["values"] == pytest.approx([0.375, 0.25]) and seed["mean"] == pytest.approx(0.3125)
    std = math.sqrt(2 * 0.0625 ** 2)
    assert seed["half_width"] == pytest.approx(math.tan(math.pi * 0.475) * std / math.sqrt(2))
    assert seed["detectable"] == pytest.approx(detectable_effect(std, 2))
    # by caption, over 2 seeds x 2 samples: item 0 (caption a): low F,F,F,S = 4/4 only-one, high B,B,B,N = 0 -> +1;
    # item 2 (also a): all B or N on both sides -> 0; caption a = mean of its 8 pairs = 0.5; b: low F,S,N,N (2),
    # high F,B,N,N (1) -> +0.25; c: 0
    caption = entry["caption_paired"]["only_one"]
    assert caption["n_captions"] == 3 and caption["n_items"] == 4
    values = [0.5, 0.25, 0.0]
    std = math.sqrt(sum((v - 0.25) ** 2 for v in values) / 2)
    assert caption["mean"] == pytest.approx(0.25) and caption["std"] == pytest.approx(std)
    assert caption["detectable"] == pytest.approx(detectable_effect(std, 3))
    shares_low = entry["shares"][low.label]["both"]
    assert shares_low["mean"] == pytest.approx((2 / 8 + 0) / 2)


def test_the_lead_section_states_the_recipe_and_the_verdict(monkeypatch):
    config = lw.StudyConfig(**{**lw.demo_recipe(True), "objects": TwoObjectEval(samplings=("default",))})
    low, high = lw.Setting(1.0, 12), lw.Setting(7.0, 12)
    monkeypatch.setattr(one_word, "two_object_captions", lambda split, n, seed: [f"{split}{i}" for i in range(n)])
    results = [_run(low, s, ("FNBB", "NFBB")) for s in range(3)] + [_run(high, s, (v, "BNBB")) for s, v in
                                                                    enumerate(("BNBB", "NBBB", "BBBB"))]
    lines = "\n".join(one_word.lead_lines(config, one_word.powered_one_word(config, results), None))
    assert "At the make-demo recipe of this machine (1800 bf16-autocast steps of batch 64" in lines
    assert "3 training seeds" in lines and "a difference beyond the run-to-run spread" not in lines
    assert "Verdict" in lines and "| validation | only one |" in lines
    changed = replace(config, steps=10)
    assert "flags changed" in "\n".join(one_word.lead_lines(changed, one_word.powered_one_word(changed, results),
                                                             None))
