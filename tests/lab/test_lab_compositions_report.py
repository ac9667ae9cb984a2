"""lab.studies.align.compositions' report arithmetic, on two small results files written here: the relative change
of pixel diversity per seed with its t-interval, and the Welch comparison of two files' per-seed finals."""
import json

from dalle_lab.stats import mean_ci, welch_test
from lab.studies.align.compositions import compare, relative_changes


def _results(path, name, finals, start):
    summary = {key: {"start": [start[key]], "per_seed_final": {str(s): v for s, v in enumerate(values)}}
               for key, values in finals.items()}
    path.write_text(json.dumps({"name": name, "summary": summary}))
    return path


def test_relative_change_of_diversity_is_each_seeds_final_over_the_start(tmp_path):
    path = _results(tmp_path / "a.json", "a", {"heldout_diversity_pixel": [0.04, 0.045, 0.05]},
                    {"heldout_diversity_pixel": 0.05})
    line = relative_changes([path])
    expected = mean_ci([-0.2, -0.1, 0.0])
    assert "-20.0%, -10.0%, +0.0%" in line
    assert f"mean {expected.mean:+.1%} +- {expected.half_width:.1%}" in line


def test_compare_is_welchs_test_of_the_per_seed_finals(tmp_path):
    a = _results(tmp_path / "a.json", "a", {"heldout_accuracy": [0.93, 0.94, 0.95]}, {"heldout_accuracy": 0.8})
    b = _results(tmp_path / "b.json", "b", {"heldout_accuracy": [0.90, 0.88, 0.91]}, {"heldout_accuracy": 0.8})
    result = welch_test([0.93, 0.94, 0.95], [0.90, 0.88, 0.91])
    text = compare(a, b)
    assert text.startswith("a minus b")
    assert f"heldout_accuracy: {result.difference:+.3f} +- {result.half_width:.3f} (p = {result.p_value:.3f})" in text
    assert "val_accuracy" not in text  # only measures both files have
