"""A wandb run that cannot start (no API key, a refused login) is one line saying how to log in or log offline."""
import pytest

from dalle_lab.utils import open_wandb


def test_a_wandb_run_without_an_api_key_is_one_line_with_the_ways_out(monkeypatch):
    wandb = pytest.importorskip("wandb")

    def refuse(**kwargs):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", refuse)
    with pytest.raises(ValueError, match=r"wandb could not start the run 'probe' \(No API key configured.*"
                                         r"WANDB_MODE=offline") as err:
        open_wandb("probe")
    assert "\n" not in str(err.value)
