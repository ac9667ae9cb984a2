"""The loss-weighting study, tiny: runs through the real training loop and evaluation, writes the report, reuses
finished runs, resumes an unfinished one, refuses to mix runs of different settings."""
import json
import math
import os
from pathlib import Path

import pytest
import torch

from lab.studies.loss_weighting import run as lw
from lab.studies.loss_weighting.claims import caption_attention_measures, paired_difference
from lab.studies.loss_weighting.report import write_report
from dalle_lab.evaluate.shapes import EvalSettings, caption_token_mask
from dalle_lab.stats import mean_ci


def tiny_study(tiny_vqgan, root, **overrides) -> lw.StudyConfig:
    ckpt, yaml = tiny_vqgan
    settings = dict(seeds=2, steps=4, batch_size=4, warmup_steps=1, dim=32, depth=1, heads=2, dim_head=16,
                    log_every_n_steps=1, save_every_n_steps=2, workers=1,
                    eval=EvalSettings(n_val=2, n_heldout=2, n_loss=4, batch_size=4),
                    out_dir=str(root / "report"), runs_dir=str(root / "runs"),
                    vqgan_model_path=str(ckpt), vqgan_config_path=str(yaml))
    settings.update(overrides)
    return lw.StudyConfig(**settings)


@pytest.fixture(scope="module")
def finished_study(tiny_vqgan, tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    config = tiny_study(tiny_vqgan, root)
    lines = []
    outcome = lw.run_study(config, log=lines.append)
    return config, outcome, lines


def test_study_trains_every_setting_and_seed_at_equal_compute(finished_study):
    config, outcome, lines = finished_study
    assert outcome["failures"] == []
    results = outcome["results"]
    assert sorted((r["setting"], r["seed"]) for r in results) == sorted(
        (s, k) for s in ("w1_T16", "w7_T16", "w1_T64", "w7_T64", "w1_T16_noise0.25", "w7_T16_noise0.25")
        for k in (0, 1))
    assert len(lines) == 12 and lines[-1].startswith("[12/12]")
    for r in results:
        train = r["train"]
        assert train["steps"] == 4 and train["samples_seen"] == 16  # the same budget for every setting
        assert r["curves"]["step"] == [1, 2, 3, 4]
        w = r["identity"]["setting"]["loss_img_weight"]
        for total, text, img in zip(r["curves"]["loss"], r["curves"]["loss_text"], r["curves"]["loss_img"]):
            assert total == pytest.approx((text + w * img) / (w + 1), rel=1e-4)  # each run used its own weight
        for split in ("val", "heldout"):
            numbers = r["eval"][split]
            assert 0.0 <= numbers["accuracy"] <= 1.0 and numbers["exact_match"] in (0.0, 0.5, 1.0)
            assert numbers["n_generated"] == 2 and numbers["n"] == 4
            assert all(math.isfinite(numbers[k]) for k in ("loss_text", "loss_text_caption", "loss_img"))
    # a seed fixes the sample stream: the first step's image loss of w=1 and w=7 (same T, same init) agree
    by_key = {(r["setting"], r["seed"]): r for r in results}
    first = [by_key[(name, 0)]["curves"]["loss_img"][0] for name in ("w1_T16", "w7_T16")]
    assert first[0] == pytest.approx(first[1], rel=1e-5)
    # the noise arm trained on other captions (same images, same init): its text loss differs from step 1
    noisy, clean = by_key[("w1_T16_noise0.25", 0)], by_key[("w1_T16", 0)]
    assert noisy["identity"]["setting"]["caption_noise"] == 0.25
    assert noisy["curves"]["loss_text"] != pytest.approx(clean["curves"]["loss_text"], rel=1e-4)
    for r in results:  # the one-word breakdown: every two-object caption lands in exactly one outcome
        for split in ("val", "heldout"):
            objects = r["eval"][split]["objects"]["objects"]
            assert sum(objects["counts"].values()) == objects["n"]


def test_study_writes_the_report_table_plots_and_json(finished_study):
    config, outcome, _ = finished_study
    out = outcome["report"].parent
    readme = outcome["report"].read_text()
    assert "PARTIAL" not in readme
    for label in ("w=1, T=16", "w=7, T=16", "w=1, T=64", "w=7, T=64", "w=1, T=16, noise 25%"):
        assert f"| {label} | 2 | " in readme
    assert readme.index("## Answers to the discussion's claims") < readme.index("## Set-up")
    assert "## What the data shows" in readme and "Welch" in readme
    assert "--steps 4" in readme  # the reproducing command carries the non-default flags
    from PIL import Image

    for name in ("accuracy.png", "loss_curves.png", "samples.png", "attention_words.png"):
        assert f"]({name})" in readme
        with Image.open(out / name) as image:
            assert image.format == "PNG" and image.width > 100
        assert (out / name).stat().st_size < 300_000  # small enough to commit
    document = json.loads((out / "results.json").read_text())
    assert document["status"] == "complete" and document["runs_finished"] == 12
    summary = document["summary"]["w1_T16"]["val_accuracy"]
    values = summary["values"]
    assert len(values) == 2 and summary["mean"] == pytest.approx(sum(values) / 2)
    assert summary["half_width"] == pytest.approx(mean_ci(values).half_width)  # the t-interval over 2 seeds
    factors = {row["factor"] for row in document["comparisons"]}
    assert factors == {"loss_img_weight", "text_seq_len", "caption_noise"}
    claims = document["claims"]
    interaction = claims["noise"]["interaction"]["val_accuracy"]
    by_key = {(r["setting"], r["seed"]): r["eval"]["val"]["accuracy"] for r in outcome["results"]}
    expected = [(by_key[("w1_T16_noise0.25", k)] - by_key[("w7_T16_noise0.25", k)])
                - (by_key[("w1_T16", k)] - by_key[("w7_T16", k)]) for k in (0, 1)]
    assert interaction["values"] == pytest.approx(expected)  # paired by seed, exactly this difference
    assert interaction["mean"] == pytest.approx(sum(expected) / 2)
    runs = {(r["setting"], r["seed"]): r for r in outcome["results"]}
    for k in (0, 1):  # the attention measures: shares of a distribution, and the claim pairs them by seed
        measures = [caption_attention_measures(runs[(name, k)]["eval"]["attention_words"])
                    for name in ("w1_T16", "w7_T16")]
        assert all(0 < m["caption_share"] < 1 and m["role_entropy"] > 0 for m in measures)
        assert claims["attention"]["differences"]["role_entropy"]["values"][k] == pytest.approx(
            measures[0]["role_entropy"] - measures[1]["role_entropy"])
    assert all(0.0 <= row["p_holm"] <= 1.0 for row in document["comparisons"] if row["p_holm"] is not None)


def test_finished_runs_are_reused_not_retrained(finished_study):
    config, _, _ = finished_study
    metrics = sorted(Path(config.runs_dir).rglob("dalle-metrics.jsonl"))
    before = [p.stat().st_mtime_ns for p in metrics]
    again = lw.run_study(config, log=lambda line: None)
    assert all(r["cached"] for r in again["results"]) and len(again["results"]) == 12
    assert [p.stat().st_mtime_ns for p in metrics] == before


def test_report_only_collects_the_runs_of_these_settings(finished_study):
    config, _, _ = finished_study
    assert len(lw.collect_cached(config)) == 12
    skipped = []
    other = lw.StudyConfig(**{**config.__dict__, "learning_rate": 5e-4})
    assert lw.collect_cached(other, log=skipped.append) == [] and len(skipped) == 12


def test_cached_run_of_other_settings_is_refused(finished_study):
    config, _, _ = finished_study
    other = lw.StudyConfig(**{**config.__dict__, "steps": 5})
    with pytest.raises(ValueError, match="--runs_dir"):
        lw.run_one(other, lw.Setting(1.0, 16), 0, lw.resolve_image_tokenizer(other))


def test_new_evaluation_settings_reevaluate_without_retraining(tiny_vqgan, tmp_path):
    config = tiny_study(tiny_vqgan, tmp_path, seeds=1, loss_img_weights=(1.0,), text_seq_lens=(16,))
    spec = lw.resolve_image_tokenizer(config)
    setting = lw.Setting(1.0, 16)
    first = lw.run_one(config, setting, 0, spec)
    metrics = lw.run_dir(config, setting, 0) / "dalle-metrics.jsonl"
    before = metrics.stat().st_mtime_ns
    more = lw.StudyConfig(**{**config.__dict__, "eval": EvalSettings(n_val=3, n_heldout=1, n_loss=4, batch_size=4)})
    again = lw.run_one(more, setting, 0, spec)
    assert not again["cached"] and again["eval"]["val"]["n_generated"] == 3
    assert metrics.stat().st_mtime_ns == before and again["curves"] == first["curves"]  # no training step was taken
    assert again["train"]["steps"] == 4


def test_an_interrupted_run_of_other_settings_is_not_continued(tiny_vqgan, tmp_path):
    config = tiny_study(tiny_vqgan, tmp_path, seeds=1, loss_img_weights=(7.0,), text_seq_lens=(16,))
    spec = lw.resolve_image_tokenizer(config)
    setting = lw.Setting(7.0, 16)
    lw.run_one(config, setting, 0, spec)
    (lw.run_dir(config, setting, 0) / lw.RESULT_FILE).unlink()  # killed before finishing, checkpoint left
    longer = lw.StudyConfig(**{**config.__dict__, "steps": 6})
    with pytest.raises(ValueError, match="other settings"):
        lw.run_one(longer, setting, 0, spec)


def test_an_interrupted_run_resumes_from_its_checkpoint(tiny_vqgan, tmp_path):
    config = tiny_study(tiny_vqgan, tmp_path, seeds=1, loss_img_weights=(7.0,), text_seq_lens=(16,))
    paths = lw.resolve_image_tokenizer(config)
    setting = lw.Setting(7.0, 16)
    lw.run_one(config, setting, 0, paths)
    directory = lw.run_dir(config, setting, 0)
    straight = json.loads((directory / lw.RESULT_FILE).read_text())
    (directory / lw.RESULT_FILE).unlink()  # as if killed after training, before the result was written
    resumed = lw.run_one(config, setting, 0, paths)
    assert resumed["train"]["resumed"] and resumed["train"]["steps"] == 4
    assert resumed["curves"] == straight["curves"]
    assert resumed["eval"] == straight["eval"]  # evaluation is deterministic given the checkpoint


@pytest.mark.skipif(os.environ.get("DALLE_LAB_SLOW_TESTS") != "1",
                    reason="starts two worker processes (~30 s on 2 busy cores); set DALLE_LAB_SLOW_TESTS=1")
def test_parallel_workers_give_the_same_numbers(finished_study, tiny_vqgan, tmp_path):
    config, outcome, _ = finished_study
    parallel = tiny_study(tiny_vqgan, tmp_path, seeds=1, workers=2, loss_img_weights=(1.0, 7.0), text_seq_lens=(16,),
                          caption_noise=0.0)
    results = lw.run_study(parallel, log=lambda line: None)["results"]
    serial = {r["setting"]: r for r in outcome["results"] if r["seed"] == 0}
    assert sorted(r["setting"] for r in results) == ["w1_T16", "w7_T16"]
    for r in results:  # separate processes, same seed and settings: the same run
        assert r["curves"]["loss"] == pytest.approx(serial[r["setting"]]["curves"]["loss"], rel=1e-5)


def test_partial_report_is_labelled(finished_study, tmp_path):
    config, outcome, _ = finished_study
    partial = lw.StudyConfig(**{**config.__dict__, "out_dir": str(tmp_path / "partial")})
    some = [r for r in outcome["results"] if r["seed"] == 0]
    readme = write_report(partial, some, 12, []).read_text()
    assert "PARTIAL REPORT: 6 of 12 runs finished" in readme
    assert json.loads((tmp_path / "partial" / "results.json").read_text())["status"] == "partial"


def test_caption_token_mask_keeps_caption_and_its_end():
    text = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0], [1, 2, 3, 4]])
    assert caption_token_mask(text).tolist() == [[True, True, True, False], [True, True, False, False],
                                                 [True, True, True, True]]


def test_command_line_defaults_are_the_config_defaults():
    args = lw.build_parser().parse_args([])
    assert lw.config_from_args(args) == lw.StudyConfig()
    quick = lw.config_from_args(lw.build_parser(quick=True).parse_args(["--quick", "--seeds", "2"]))
    assert quick == lw.StudyConfig(**{**lw.StudyConfig().__dict__, **lw.QUICK, "seeds": 2})
    assert quick.settings() == [lw.Setting(w, t) for t in (16, 64) for w in (1.0, 7.0)]  # no noise arm
    assert lw.main(["--seeds", "0"]) == 2


def test_caption_attention_measures_follow_their_formula():
    layer_one = {"color": 0.1, "shape": 0.1, "function_words": 0.0, "bos": 0.3, "pad": 0.1, "image": 0.4}
    layer_two = {"color1": 0.2, "shape1": 0.1, "relation": 0.1, "bos": 0.2, "pad": 0.0, "image": 0.4}
    attention = {"by_kind": {"one_object": {"n_captions": 3, "layers": [layer_one]},
                             "two_objects": {"n_captions": 1, "layers": [layer_two]}}}
    measures = caption_attention_measures(attention)
    assert measures["caption_share"] == pytest.approx((3 * 0.2 + 1 * 0.4) / 4)
    two = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert measures["role_entropy"] == pytest.approx((3 * math.log(2) + 1 * two) / 4)


def test_paired_difference_pairs_runs_by_seed_and_skips_unpaired_seeds():
    a, b = lw.Setting(1.0, 16), lw.Setting(7.0, 16)
    results = [{"setting": a.name, "seed": 0, "x": 1.0}, {"setting": b.name, "seed": 0, "x": 0.5},
               {"setting": a.name, "seed": 1, "x": 2.0}, {"setting": b.name, "seed": 1, "x": 1.0},
               {"setting": a.name, "seed": 2, "x": 9.0}]  # seed 2 has no partner
    entry = paired_difference(results, a, b, lambda r: r["x"])
    assert entry["values"] == [0.5, 1.0] and entry["mean"] == pytest.approx(0.75)
    assert entry["half_width"] == pytest.approx(mean_ci([0.5, 1.0]).half_width)


def test_claims_of_a_grid_with_one_text_context_say_what_was_not_measured():
    from lab.studies.loss_weighting.claims import all_claims, claim_lines

    lines = "\n".join(claim_lines(all_claims(lw.StudyConfig(text_seq_lens=(16,)), [])))
    assert "Not measured in this report: its grid has one text_seq_len" in lines
    assert "w=1, T=16 minus w=1, T=16" not in lines  # no comparison of a setting with itself


def test_noise_interaction_is_the_noisy_weight_gap_minus_the_clean_one_seed_by_seed():
    from lab.studies.loss_weighting.claims import claim_noise

    config = lw.StudyConfig(text_seq_lens=(16,), caption_noise=0.25, noise_text_seq_len=16)
    accuracy = {("w1_T16", 0): 0.70, ("w7_T16", 0): 0.60, ("w1_T16_noise0.25", 0): 0.50, ("w7_T16_noise0.25", 0): 0.55,
                ("w1_T16", 1): 0.72, ("w7_T16", 1): 0.62, ("w1_T16_noise0.25", 1): 0.58, ("w7_T16_noise0.25", 1): 0.50}
    results = [{"setting": name, "seed": seed, "eval": {"val": {"accuracy": value}}}
               for (name, seed), value in accuracy.items()]
    noise = claim_noise(config, results)
    # seed 0: (0.50 - 0.55) - (0.70 - 0.60) = -0.15; seed 1: (0.58 - 0.50) - (0.72 - 0.62) = -0.02
    assert noise["interaction"]["val_accuracy"]["values"] == pytest.approx([-0.15, -0.02])
    assert noise["noise_effect"]["val_accuracy w=1, T=16, noise 25%"]["values"] == pytest.approx([-0.20, -0.14])
    assert noise["interaction"]["val_exact_match"] is None  # not measured in these results: said, not invented


def test_one_word_claim_counts_images_with_exactly_one_object_right():
    from lab.studies.loss_weighting.claims import claim_one_word

    def run(name, seed, first, second, both):
        shares = {"both": both, "first_only": first, "second_only": second, "neither": 1 - first - second - both}
        return {"setting": name, "seed": seed, "eval": {"val": {"objects": {"objects": {"shares": shares}}}}}
    results = [run("w1_T16", 0, 0.3, 0.1, 0.4), run("w7_T16", 0, 0.2, 0.1, 0.5),
               run("w1_T16", 1, 0.2, 0.2, 0.3), run("w7_T16", 1, 0.1, 0.1, 0.6)]
    d = claim_one_word(lw.StudyConfig(text_seq_lens=(16,)), results)["differences"]
    assert d["val_only_one"]["values"] == pytest.approx([0.1, 0.2])  # (first + second only), w=1 minus w=7
    assert d["val_both"]["values"] == pytest.approx([-0.1, -0.3])
    assert d["heldout_only_one"] is None


def test_runs_imported_from_an_earlier_report_are_not_retrained(finished_study, tmp_path):
    # a study continued on another machine: its runs_dir is gone, the committed report's results.json is not
    config, _, _ = finished_study
    report = json.loads((Path(config.out_dir) / "results.json").read_text())
    fresh = lw.StudyConfig(**{**config.__dict__, "runs_dir": str(tmp_path / "runs"),
                              "out_dir": str(tmp_path / "report")})
    half = {**report, "runs": [r for r in report["runs"] if r["seed"] == 0]}
    (tmp_path / "old.json").write_text(json.dumps(half))
    assert lw.import_results(fresh, tmp_path / "old.json", log=lambda line: None) == 6
    assert lw.import_results(fresh, tmp_path / "old.json", log=lambda line: None) == 0  # never over a result
    lines = []
    outcome = lw.run_study(fresh, log=lines.append)
    by_seed = {seed: [r.get("cached", False) for r in outcome["results"] if r["seed"] == seed] for seed in (0, 1)}
    assert by_seed[0] == [True] * 6 and by_seed[1] == [False] * 6  # only the missing seed was trained
    assert not list((tmp_path / "runs").rglob("seed0/dalle-metrics.jsonl"))
    old = {(r["setting"], r["seed"]): r["eval"] for r in report["runs"]}
    assert all(r["eval"] == old[(r["setting"], r["seed"])] for r in outcome["results"] if r["seed"] == 0)


def test_runs_of_other_settings_are_not_imported(finished_study, tmp_path):
    config, _, _ = finished_study
    other = lw.StudyConfig(**{**config.__dict__, "runs_dir": str(tmp_path / "runs"), "steps": 5})
    skipped = []
    assert lw.import_results(other, Path(config.out_dir) / "results.json", log=skipped.append) == 0
    assert sum("other settings" in line for line in skipped) == 12
    with pytest.raises(FileNotFoundError, match="--import_results"):
        lw.import_results(other, tmp_path / "missing.json")
