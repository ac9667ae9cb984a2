"""A tiny alignment run for tests/test_align_processes.py and tests/test_align_deepspeed.py, alone or under torchrun:
    python align_worker.py OUT METHOD TRAIN_BATCH GA [NAME=VALUE ...]  (zero_stage, optimizer, lr, ...: see run)
Process 0 saves the final transformer weights to OUT/weights.pt."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)


def run(out_dir, method: str, train_batch_size: int, ga: int, log_fn=lambda _: None, full: bool = True,
        zero_stage: int | None = None, prompts_per_epoch: int = 2, group_size: int = 4, epochs: int = 2,
        resume: int = 0, optimizer: str = "adamw", lr: float = 1e-3, max_grad_norm: float = 1.0):
    """full: AlignTrainer.train (logs, plots, grids, checkpoints by process 0); else just the epochs' updates.
    zero_stage: DeepSpeed's engine at that ZeRO stage (None: plain PyTorch). optimizer "sgd" with a max_grad_norm
    that never clips makes the weights proportional to the gradient's scale (Adam and clipping would hide it)."""
    from test_align_finetune import PROMPTS, tiny_dalle

    from dalle_lab.align.config import AlignConfig
    from dalle_lab.align.policy_gradient import PolicyGradientTrainer
    from dalle_lab.align.reward_backprop import RewardBackpropTrainer
    from dalle_lab.rewards import brightness
    from dalle_lab.tokenizers import get_tokenizer

    tokenizer = get_tokenizer()
    config = AlignConfig(method=method, epochs=epochs, prompts_per_epoch=prompts_per_epoch, group_size=group_size,
                         sample_batch_size=2, deepspeed_zero_stage=zero_stage,
                         train_batch_size=train_batch_size, gradient_accumulation_steps=ga, inner_epochs=2,
                         optimizer=optimizer, lr=lr, max_grad_norm=max_grad_norm, stat_min_count=2, seed=0, top_k=8,
                         cond_scale=1.5, backprop_last_k=6,
                         backprop_last_k_min=2 if method == "reward_backprop" else None)
    cls = RewardBackpropTrainer if method == "reward_backprop" else PolicyGradientTrainer
    trainer = cls(tiny_dalle(tokenizer), tokenizer, config, PROMPTS, out_dir, reward=brightness, log_fn=log_fn,
                  resume=resume)
    if full:
        history = trainer.train()
    else:
        history = []
        for epoch in range(trainer.epoch, config.epochs):
            history.append(trainer.train_epoch(trainer.epoch_prompts(epoch)))
            trainer.epoch += 1
    weights = {name: p.detach().clone() for name, p in trainer.dalle.named_parameters()}
    if trainer.processes.is_main:
        torch.save({"weights": weights, "history": history}, Path(out_dir) / "weights.pt")
    return weights, history


if __name__ == "__main__":
    out, method, tbs, ga, *extra = sys.argv[1:]
    kinds = {"zero_stage": int, "prompts_per_epoch": int, "group_size": int, "epochs": int, "resume": int,
             "optimizer": str, "lr": float, "max_grad_norm": float}
    options = {key: kinds[key](value) for key, value in (item.split("=", 1) for item in extra)}
    run(out, method, int(tbs), int(ga), log_fn=print, **options)
