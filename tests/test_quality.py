"""`python -m dalle_lab.quality`: a trained Shapes model scored on unseen captions, with the main job's targets."""
import json

from dalle_lab import quality


def test_quality_scores_both_splits_and_says_which_targets_are_met(tiny_dalle_checkpoint, tmp_path, capsys):
    out = tmp_path / "quality.json"
    argv = ["--dalle_path", str(tiny_dalle_checkpoint), "--n_val", "3", "--n_heldout", "2", "--batch_size", "3",
            "--no_ceiling", "--json", str(out)]
    assert quality.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["validation"]["n"] == 3 and report["heldout"]["n"] == 2
    for split in ("validation", "heldout"):
        assert 0 <= report[split]["accuracy"] <= 1 and 0 <= report[split]["chance_accuracy"] <= 1
    assert set(report["git"]) == {"commit", "dirty"} and "avx512_bf16" in report["machine"]["cpu"]
    printed = capsys.readouterr().out
    assert printed.count("target ") == 4  # the main job's four targets, each met or NOT met
    assert "target validation accuracy >= 0.90" in printed

    # the same seed samples the same images: the numbers repeat exactly
    again = tmp_path / "again.json"
    quality.main(argv[:-1] + [str(again)])
    second = json.loads(again.read_text())
    assert second["validation"]["accuracy"] == report["validation"]["accuracy"]


def test_a_model_of_other_data_is_refused_in_one_line(other_data_checkpoint, tmp_path, capsys):
    """Scoring an own-data model on Shapes captions with the Shapes checker would report a meaningless accuracy."""
    path = other_data_checkpoint
    assert quality.main(["--dalle_path", str(path), "--n_val", "2", "--n_heldout", "1", "--no_ceiling"]) == 1
    err = capsys.readouterr().err
    assert "is not a model of the built-in Shapes data" in err and err.count("\n") == 1
