"""Several processes, one result (issue 14 section 1): gradient accumulation and two processes give the weights of
one process with the whole batch, for policy gradient and reward backprop, in float32."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from align_worker import run

HERE = Path(__file__).parent
ROOT = HERE.parent


def assert_same_weights(a, b, atol=1e-5):
    """Equal up to float32 summation order: the halves sum the same gradients in another order, and AdamW divides
    each gradient by its own running scale, so a last-bit difference in a near-zero gradient becomes up to about
    1e-6 of a weight after the run's steps (lr 1e-3). 1e-5 is 1 % of one step; a lost or doubled micro-batch moves
    weights by a whole step."""
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=name)


@pytest.mark.parametrize("method", ["policy_gradient", "reward_backprop"])
def test_accumulating_two_half_batches_equals_one_full_batch(tmp_path, method):
    full, history_full = run(tmp_path / "full", method, train_batch_size=4, ga=1, full=False)
    halves, history_halves = run(tmp_path / "halves", method, train_batch_size=2, ga=2, full=False)
    moved = max(  # training moved the weights, so equality means something
        (full[k] - v).abs().max().item() for k, v in _initial(method).items())
    assert moved > 1e-4
    assert_same_weights(full, halves)
    assert [h["reward_mean"] for h in history_full] == pytest.approx([h["reward_mean"] for h in history_halves],
                                                                     abs=1e-6)


def _initial(method):
    from test_align_finetune import tiny_dalle

    from dalle_lab.tokenizers import get_tokenizer

    return {name: p.detach() for name, p in tiny_dalle(get_tokenizer()).named_parameters()}


@pytest.mark.skipif(os.environ.get("DALLE_LAB_SLOW_TESTS") != "1",
                    reason="starts two processes with torchrun (~40 s on 2 cores); set DALLE_LAB_SLOW_TESTS=1")
@pytest.mark.parametrize("method", ["policy_gradient", "reward_backprop"])
def test_two_processes_with_half_the_batch_equal_one_process(tmp_path, method):
    one, history_one = run(tmp_path / "one", method, train_batch_size=4, ga=1)
    two = tmp_path / "two"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(HERE / "align_worker.py"),
         str(two), method, "2", "1"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("[align] epoch 1") == 1  # only process 0 logs
    saved = torch.load(two / "weights.pt", weights_only=True)
    assert_same_weights(one, saved["weights"])
    assert [h["reward_mean"] for h in history_one] == pytest.approx([h["reward_mean"] for h in saved["history"]],
                                                                    abs=1e-6)


@pytest.mark.skipif(os.environ.get("DALLE_LAB_SLOW_TESTS") != "1",
                    reason="trains and resumes a run (~14 s on 2 cores); set DALLE_LAB_SLOW_TESTS=1")
def test_resume_refuses_another_number_of_samples_per_step(tmp_path):
    from test_align_finetune import PROMPTS, tiny_dalle

    from dalle_lab.align.config import AlignConfig
    from dalle_lab.align.policy_gradient import PolicyGradientTrainer
    from dalle_lab.rewards import brightness
    from dalle_lab.tokenizers import get_tokenizer

    tokenizer = get_tokenizer()

    def trainer(**overrides):
        settings = dict(epochs=1, prompts_per_epoch=2, group_size=2, sample_batch_size=4, train_batch_size=2,
                        inner_epochs=1, stat_min_count=2)
        config = AlignConfig(**{**settings, **overrides})
        return PolicyGradientTrainer(tiny_dalle(tokenizer), tokenizer, config, PROMPTS, tmp_path, reward=brightness,
                                     log_fn=lambda _: None)

    trainer().train()
    assert trainer(epochs=2).epoch == 1  # same samples per step: resumes
    with pytest.raises(ValueError, match="samples per optimizer step"):
        trainer(epochs=2, gradient_accumulation_steps=2)
