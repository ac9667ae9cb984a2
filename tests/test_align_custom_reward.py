"""Your own reward on the command line: `--reward module.function` (alone or in a weighted sum), imported as a
module on the path; bad names are one line; reward backpropagation names the function that is not differentiable."""
import json
import sys

import pytest

from dalle_lab.align.__main__ import main
from dalle_lab.rewards.registry import get_reward

TINY = ["--epochs", "1", "--prompts_per_epoch", "2", "--group_size", "2", "--sample_batch_size", "4",
        "--train_batch_size", "4", "--threads", "1", "--eval_num_prompts", "0", "--eval_num_heldout", "0",
        "--eval_loss_images", "0", "--eval_diversity_samples", "0"]
REWARD_MODULE = '''
import torch

def redness(images, prompts):
    return images[:, 0].mean(dim=(1, 2)) - images[:, 1:].mean(dim=(1, 2, 3))

def not_differentiable(images, prompts):
    return torch.zeros(len(prompts))
'''


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "my_probe_reward.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_probe_reward"
    sys.modules.pop("my_probe_reward", None)


def test_a_dotted_name_imports_the_users_function_alone_or_in_a_sum(reward_module):
    import torch

    images = torch.rand(2, 3, 8, 8)
    own = get_reward(f"{reward_module}.redness")
    assert own.__name__ == "redness" and own(images, ["a", "b"]).shape == (2,)
    summed = get_reward(f"{reward_module}.redness:2+brightness:1")(images, ["a", "b"])
    torch.testing.assert_close(summed, 2 * own(images, ["a", "b"]) + images.mean(dim=(1, 2, 3)))
    for spec, message in (("no_such_module_xyz.f", "cannot import no_such_module_xyz"),
                          (f"{reward_module}.missing", "has no function 'missing'")):
        with pytest.raises(ValueError, match=message):
            get_reward(spec)


def test_align_trains_on_it_from_the_command_line_and_names_it_when_not_differentiable(reward_module, tmp_path,
                                                                                     tiny_dalle_checkpoint, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle on a white background\na blue square on a black background\n")
    common = ["--dalle_path", str(tiny_dalle_checkpoint), "--prompts", str(prompts), *TINY]
    assert main([*common, "--reward", f"{reward_module}.redness", "--out_dir", str(tmp_path / "pg")]) == 0
    assert json.loads((tmp_path / "pg" / "results.json").read_text())["config"]["reward"] == f"{reward_module}.redness"
    assert main([*common, "--reward", f"{reward_module}.not_differentiable", "--method", "reward_backprop",
                 "--out_dir", str(tmp_path / "rb")]) == 1
    assert "my_probe_reward.not_differentiable' is not marked as one" in capsys.readouterr().err
