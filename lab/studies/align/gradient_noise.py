"""How much of one epoch's fine-tuning gradient is signal: the cosine between the gradients of independent epochs.

    python -m lab.studies.align.gradient_noise --dalle_path runs/dalle/dalle.pt

For each setting, samples `--repeats` independent batches of the same prompts (`--prompts` Shapes training captions x
`--group` samples, as one epoch of the faithfulness preset), computes each batch's gradient of the method's loss
(policy gradient: the PPO objective at ratio 1 with group advantages; reward backprop: -reward through the
straight-through tokens; no KL term), and records the cosine similarity of every pair. If a batch's gradient is the
true gradient g plus noise of variance s^2 / n over n images, the expected cosine is |g|^2 / (|g|^2 + s^2 / n), so a
cosine near 0 says that an epoch's update is almost all noise, and about n / cosine images make one gradient whose
direction is half signal. Writes lab/studies/align/results/gradient_noise.json: the command, commit, model hash, load, every
cosine, the rewards.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import sys
import time
from pathlib import Path

from lab.common import git_commit, write_results

SETTINGS = {
    "pg_guided_uniform": dict(),
    "pg_guided_content": dict(credit="content"),
    "pg_plain_uniform": dict(temperature=1.0, cond_scale=1.0),
    "pg_guided_t0.5": dict(temperature=0.5),
    "pg_guided_t0.3": dict(temperature=0.3),
    "rb_clip_score_k64": dict(method="reward_backprop", reward="clip_score", backprop_last_k=64, top_k=10),
}


def make_trainer(dalle_path: str, setting: str, prompts_per_epoch: int, group: int, seed: int, out_dir: str):
    """A fresh trainer of one SETTINGS entry on the faithfulness preset, without KL term or in-run evaluation, with
    2000 Shapes training captions as its prompt pool; (trainer, pool)."""
    import torch

    from dalle_lab.align.config import preset
    from dalle_lab.align.policy_gradient import PolicyGradientTrainer
    from dalle_lab.align.reward_backprop import RewardBackpropTrainer
    from dalle_lab.data.shapes import ShapesDataset
    from dalle_lab.training.checkpoint import load_dalle

    dataset = ShapesDataset("train", length=2000, seed=0)
    pool = [dataset.caption(i) for i in range(len(dataset))]
    dalle, tokenizer, _ = load_dalle(dalle_path, torch.device("cpu"))
    config = preset("faithfulness", prompts_per_epoch=prompts_per_epoch, group_size=group, seed=seed, kl_coef=0.0,
                    eval_num_prompts=0, eval_num_heldout=0, eval_loss_images=0, eval_diversity_samples=0,
                    **SETTINGS[setting])
    cls = RewardBackpropTrainer if config.method == "reward_backprop" else PolicyGradientTrainer
    return cls(dalle, tokenizer, config, pool, out_dir, log_fn=lambda _: None, resume=False), pool


def batch_gradient(trainer, prompts, epoch: int, params) -> tuple:
    """The flattened gradient of one freshly sampled batch of `prompts`, and the batch's mean reward."""
    import torch

    from dalle_lab.align.logprobs import policy_logprobs
    from dalle_lab.align.policy_gradient import ppo_clipped_loss

    cfg = trainer.config
    trainer.epoch = epoch
    trainer.dalle.zero_grad()
    if cfg.method == "reward_backprop":
        text = trainer.tokenize(prompts)
        tokens, _, support = trainer.sample_tokens(text, trainer.chunk_generator(epoch, 0))
        loss, rewards, _, _ = trainer.backprop_loss(text, tokens, prompts, support, cfg.backprop_last_k)
        loss.backward()  # kl_coef 0: no KL term, the reward alone
    else:
        batch = trainer.collect(prompts)
        rewards = batch["rewards"]
        advantages = trainer.advantages(prompts, batch)[0]  # (B, N): each token's, credit applied
        for index in torch.arange(len(prompts)).split(cfg.train_batch_size):
            support = batch["support"][index] if "support" in batch else None
            sampled, _, _ = policy_logprobs(trainer.dalle, batch["text"][index], batch["tokens"][index], cfg, support)
            loss, _ = ppo_clipped_loss(sampled, batch["old_logprobs"][index], advantages[index], cfg.clip_range)
            (loss * len(index) / len(prompts)).backward()
    flat = torch.cat([p.grad.flatten() for p in params if p.grad is not None]).clone()
    return flat, float(rewards.float().mean())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dalle_path", default="runs/dalle/dalle.pt")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="lab/studies/align/results/gradient_noise.json")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from dalle_lab.align.config import to_dict

    torch.set_num_threads(args.threads)
    record = {"command": ["python", *sys.argv], "git": git_commit(), "dalle_path": args.dalle_path,
              "dalle_sha256": hashlib.sha256(Path(args.dalle_path).read_bytes()).hexdigest(),
              "prompts": args.prompts, "group": args.group, "repeats": args.repeats, "seed": args.seed,
              "threads": args.threads, "load_average_before": os.getloadavg(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "settings": {}}
    for name in args.settings:
        trainer, _ = make_trainer(args.dalle_path, name, args.prompts, args.group, args.seed,
                                  f"/tmp/align_gradient_noise/{name}")
        config = trainer.config
        params = [p for p in trainer.dalle.parameters() if p.requires_grad]
        block_ids = {id(p) for p in trainer.dalle.transformer.parameters()}
        prompts = trainer.epoch_prompts(0)
        started = time.time()
        grads, rewards = [], []
        for repeat in range(args.repeats):
            grad, reward = batch_gradient(trainer, prompts, 1000 + repeat, params)
            grads.append(grad)
            rewards.append(reward)
        in_blocks = torch.cat([torch.full((p.numel(),), id(p) in block_ids) for p in params if p.grad is not None])
        pairs = list(itertools.combinations(range(args.repeats), 2))
        cos_all = [torch.nn.functional.cosine_similarity(grads[i], grads[j], 0).item() for i, j in pairs]
        cos_blocks = [torch.nn.functional.cosine_similarity(grads[i][in_blocks], grads[j][in_blocks], 0).item()
                      for i, j in pairs]
        record["settings"][name] = {
            "config": to_dict(config), "images_per_batch": len(prompts), "cosines_all_weights": cos_all,
            "cosines_transformer_blocks": cos_blocks, "mean_cosine_all": float(np.mean(cos_all)),
            "mean_cosine_blocks": float(np.mean(cos_blocks)), "batch_rewards": rewards,
            "grad_norms": [float(g.norm()) for g in grads], "seconds": time.time() - started}
        print(f"{name}: mean cosine {np.mean(cos_all):+.3f} (blocks {np.mean(cos_blocks):+.3f}) over {len(pairs)} "
              f"pairs of {len(prompts)}-image batches", flush=True)
    record["load_average_after"] = os.getloadavg()
    write_results(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
