"""Alignment under DeepSpeed (issue 14 section 1): ZeRO 0, 1 and 2 give the weights of the plain path, with gradient
accumulation, with several processes (torchrun and the deepspeed launcher) and across a resume, in float32.

The runs sample 6 images per epoch in steps of 4, so every epoch ends with a short step: one micro-batch, which under
two processes leaves process 1 without one (it runs a pass of share 0, updates.py). Most runs use SGD without
clipping, whose weights scale with the gradient (Adam and clipping would hide a gradient off by a constant factor);
one keeps AdamW with clipping active (gradient norm about 2 against max_grad_norm 1) so DeepSpeed's clipping is
compared with ours."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from align_worker import run

pytest.importorskip("deepspeed")

HERE = Path(__file__).parent
ROOT = HERE.parent
SLOW = pytest.mark.skipif(os.environ.get("DALLE_LAB_SLOW_TESTS") != "1",
                          reason="starts two DeepSpeed processes (~25 s each on 2 cores); set DALLE_LAB_SLOW_TESTS=1")
LAYOUT = dict(prompts_per_epoch=3, group_size=2)  # 6 samples: steps of 4 and 2
SGD = dict(optimizer="sgd", lr=0.05, max_grad_norm=1e6)
ADAM_CLIPPED = dict(optimizer="adamw", lr=1e-3, max_grad_norm=1.0)
_reference_cache = {}


def reference(tmp_path_factory, method, options):
    """One plain process with the whole step (train_batch_size 4, no accumulation): (weights, history) to match."""
    key = (method, tuple(sorted(options.items())))
    if key not in _reference_cache:
        out = tmp_path_factory.mktemp("plain")
        _reference_cache[key] = run(out, method, train_batch_size=4, ga=1, full=False, **LAYOUT, **options)
    return _reference_cache[key]


def assert_same_weights(expected, actual, atol=1e-5):
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=atol, msg=name)


def assert_moved(weights, method):
    """Training moved the weights well past the tolerance, so equality means something."""
    from test_align_finetune import tiny_dalle

    from dalle_lab.tokenizers import get_tokenizer

    start = dict(tiny_dalle(get_tokenizer()).named_parameters())
    assert max((weights[k] - start[k].detach()).abs().max().item() for k in weights) > 1e-3, method


@pytest.mark.parametrize("stage,method,options", [(0, "policy_gradient", SGD), (1, "reward_backprop", SGD),
                                                  (2, "policy_gradient", SGD), (2, "reward_backprop", SGD)])
def test_deepspeed_accumulation_with_a_short_last_step_equals_one_plain_batch(tmp_path, tmp_path_factory, stage,
                                                                               method, options):
    accumulated, history = run(tmp_path, method, train_batch_size=2, ga=2, full=False, zero_stage=stage, **LAYOUT,
                               **options)
    expected, expected_history = reference(tmp_path_factory, method, options)
    assert_moved(expected, method)
    assert_same_weights(expected, accumulated)
    for key in ("grad_norm", "reward_mean"):  # the logs agree too (DeepSpeed reports no gradient norm at ZeRO 0)
        assert [h[key] for h in history] == pytest.approx([h[key] for h in expected_history], rel=1e-5), key


def torchrun_worker(out_dir, method, *args, **options):
    from test_training_interrupt import child_env

    from dalle_lab.training.distributed import free_port

    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), str(HERE / "align_worker.py"), str(out_dir), method, *map(str, args),
               *[f"{k}={v}" for k, v in options.items()]]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600,
                            env={**child_env(), "PYTHONPATH": str(ROOT)})  # this checkout's dalle_lab
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@SLOW
@pytest.mark.parametrize("stage,method,options", [(0, "policy_gradient", SGD), (1, "policy_gradient", ADAM_CLIPPED),
                                                  (1, "reward_backprop", SGD), (2, "policy_gradient", SGD),
                                                  (2, "reward_backprop", SGD)])
def test_two_deepspeed_processes_with_half_the_batch_equal_one_plain_process(tmp_path, tmp_path_factory, stage,
                                                                             method, options):
    result = torchrun_worker(tmp_path, method, 2, 1, zero_stage=stage, **LAYOUT, **options)
    assert result.stdout.count("[align] epoch 1") == 1  # only process 0 logs
    saved = torch.load(tmp_path / "weights.pt", weights_only=True)
    assert_same_weights(reference(tmp_path_factory, method, options)[0], saved["weights"])


@SLOW
@pytest.mark.parametrize("stage", [None, 2])
def test_two_processes_resume_to_the_weights_of_the_straight_plain_run(tmp_path, tmp_path_factory, stage):
    """Two processes, plain or ZeRO-2, AdamW: one epoch, then a new launch resumes for the second: the optimizer's
    moments (for DeepSpeed from its packed engine state) and the epoch count must come back for the weights to
    match the uninterrupted one-process run."""
    options = dict(**LAYOUT, **ADAM_CLIPPED, **({} if stage is None else {"zero_stage": stage}))
    torchrun_worker(tmp_path, "policy_gradient", 2, 1, epochs=1, resume=1, **options)
    result = torchrun_worker(tmp_path, "policy_gradient", 2, 1, epochs=2, resume=1, **options)
    assert "resumed" in result.stdout and "at epoch 1" in result.stdout
    saved = torch.load(tmp_path / "weights.pt", weights_only=True)
    assert_same_weights(reference(tmp_path_factory, "policy_gradient", ADAM_CLIPPED)[0], saved["weights"])


# ------------------------------------------------------------------ the command line under the deepspeed launcher

from test_align_cli import tiny_checkpoint  # noqa: E402,F401  (a fixture: the tiny DALLE checkpoint and prompts)

CLI_RUN = ["--prompts_per_epoch", "3", "--group_size", "2", "--sample_batch_size", "2", "--optimizer", "sgd",
           "--lr", "0.05", "--max_grad_norm", "1e6", "--threads", "1", "--eval_every", "0", "--eval_num_prompts", "0",
           "--eval_num_heldout", "0", "--eval_loss_images", "0", "--eval_diversity_samples", "0"]


@SLOW
def test_cli_under_the_deepspeed_launcher_resumes_to_the_plain_one_process_weights(tiny_checkpoint, tmp_path):
    """`deepspeed --num_accelerators 2 --module dalle_lab.align ...` (the launcher passes --local_rank), ZeRO-1, one
    epoch, then the same command with --epochs 2 resumes: the exported model equals one plain process's."""
    from test_training_interrupt import child_env

    from dalle_lab.align.__main__ import main
    from dalle_lab.training.checkpoint import load_dalle
    from dalle_lab.training.distributed import free_port

    dalle_path, prompts = tiny_checkpoint
    common = ["--dalle_path", str(dalle_path), "--prompts", str(prompts), *CLI_RUN]
    out = tmp_path / "deepspeed"
    for epochs in ("1", "2"):
        command = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_accelerators", "2", "--master_port",
                   str(free_port()), "--module", "dalle_lab.align", *common, "--out_dir", str(out),
                   "--train_batch_size", "2", "--deepspeed_zero_stage", "1", "--epochs", epochs]
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600,
                                env={**child_env(), "PYTHONPATH": str(ROOT)})
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "resumed" in result.stdout and result.stdout.count("[align] model:") == 1  # process 0 reports
    assert main([*common, "--out_dir", str(tmp_path / "plain"), "--train_batch_size", "4", "--epochs", "2"]) == 0
    start = torch.load(dalle_path, weights_only=True)["model"]
    plain = load_dalle(tmp_path / "plain" / "dalle_aligned.pt")[0].state_dict()
    two = load_dalle(out / "dalle_aligned.pt")[0].state_dict()
    assert max((plain[k] - start[k]).abs().max().item() for k in start) > 1e-3
    assert_same_weights({k: plain[k] for k in start}, {k: two[k] for k in start})


# ------------------------------------------------------------------ what runs in one process only, and where

def test_best_of_n_refuses_several_processes(monkeypatch, tmp_path):
    """best-of-n samples and steps on the whole epoch in every process: refused under a launcher, not run N times."""
    from test_align_finetune import PROMPTS, tiny_dalle

    from dalle_lab.align import trainer as trainer_module
    from dalle_lab.align.best_of_n import BestOfNTrainer
    from dalle_lab.align.config import AlignConfig
    from dalle_lab.align.processes import Processes
    from dalle_lab.rewards import brightness
    from dalle_lab.tokenizers import get_tokenizer
    from dalle_lab.training.distributed import DistInfo

    class TwoProcesses(Processes):  # what torchrun --nproc_per_node 2 announces, without a process group
        def __init__(self, device):
            self.info = DistInfo(rank=0, world_size=2)
            self.rank, self.world_size, self.device = 0, 2, torch.device(device)

    monkeypatch.setattr(trainer_module, "Processes", TwoProcesses)
    tokenizer = get_tokenizer()
    with pytest.raises(ValueError, match="--method best_of_n runs in one process only \\(2 were started\\)"):
        BestOfNTrainer(tiny_dalle(tokenizer), tokenizer, AlignConfig(method="best_of_n"), PROMPTS, tmp_path,
                       reward=brightness, log_fn=lambda _: None)


def test_each_process_gets_its_own_gpu_and_the_cli_takes_the_launchers_local_rank():
    from dalle_lab.align.__main__ import build_parser
    from dalle_lab.training.distributed import DistInfo, process_device

    two = DistInfo(rank=1, world_size=2, local_rank=1)
    assert process_device("cuda", two) == torch.device("cuda", 1)
    assert process_device("cuda:0", two) == torch.device("cuda", 0)  # an explicit choice is kept
    assert process_device("cuda", DistInfo()) == torch.device("cuda") and process_device("cpu", two).type == "cpu"
    assert build_parser().parse_args(["--dalle_path", "x.pt", "--local_rank=1"]).local_rank == 1
