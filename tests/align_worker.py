"""A tiny alignment run for tests/test_align_processes.py: `python align_worker.py OUT METHOD TRAIN_BATCH GA`, alone or
under torchrun. Process 0 saves the final transformer weights to OUT/weights.pt."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)


def run(out_dir, method: str, train_batch_size: int, ga: int, log_fn=lambda _: None, full: bool = True):
    """full: AlignTrainer.train (logs, plots, grids, checkpoints by process 0); else just the two epochs' updates."""
    from test_align_finetune import PROMPTS, tiny_dalle

    from dalle_lab.align.config import AlignConfig
    from dalle_lab.align.policy_gradient import PolicyGradientTrainer
    from dalle_lab.align.reward_backprop import RewardBackpropTrainer
    from dalle_lab.rewards import brightness
    from dalle_lab.tokenizers import get_tokenizer

    tokenizer = get_tokenizer()
    config = AlignConfig(method=method, epochs=2, prompts_per_epoch=2, group_size=4, sample_batch_size=2,
                         train_batch_size=train_batch_size, gradient_accumulation_steps=ga, inner_epochs=2,
                         lr=1e-3, stat_min_count=2, seed=0, top_k=8, cond_scale=1.5, backprop_last_k=6,
                         backprop_last_k_min=2 if method == "reward_backprop" else None)
    cls = RewardBackpropTrainer if method == "reward_backprop" else PolicyGradientTrainer
    trainer = cls(tiny_dalle(tokenizer), tokenizer, config, PROMPTS, out_dir, reward=brightness, log_fn=log_fn,
                  resume=False)
    if full:
        history = trainer.train()
    else:
        history = []
        for epoch in range(config.epochs):
            history.append(trainer.train_epoch(trainer.epoch_prompts(epoch)))
            trainer.epoch += 1
    weights = {name: p.detach().clone() for name, p in trainer.dalle.named_parameters()}
    if trainer.processes.is_main:
        torch.save({"weights": weights, "history": history}, Path(out_dir) / "weights.pt")
    return weights, history


if __name__ == "__main__":
    out, method, tbs, ga = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    run(out, method, tbs, ga, log_fn=print)
