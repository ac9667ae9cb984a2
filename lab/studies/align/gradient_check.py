"""Does one big-batch fine-tuning gradient point uphill? A finite-difference check of the expected reward.

    python -m lab.studies.align.gradient_check --dalle_path runs/dalle/dalle.pt --setting rb_clip_score_k64

Computes the method's gradient on `--batch` images (`--batch / --group` Shapes training captions x `--group`
samples; policy gradient: the PPO objective at ratio 1 with group advantages; reward backprop: -reward through the
straight-through tokens; no KL term), then moves every trainable weight by eta along the normalised ascent
direction, for each eta of `--etas`, and measures the expected reward on `--eval` fresh samples of other training
captions, drawn with the same generators as at the start (common random numbers). A direction that points uphill
raises the reward for small eta; eta 0 checks that the evaluation repeats itself exactly, and two steps along a
random direction of the same length show what a step of that size does by itself. Writes
lab/studies/align/results/gradient_check_<setting>.json with every difference and its standard error.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

from lab.common import git_commit, write_results
from lab.studies.align.gradient_noise import SETTINGS, batch_gradient, make_trainer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dalle_path", default="runs/dalle/dalle.pt")
    parser.add_argument("--setting", default="rb_clip_score_k64", choices=list(SETTINGS))
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--eval", type=int, default=512)
    parser.add_argument("--etas", type=float, nargs="+", default=[0.0, 0.02, 0.05, 0.1, 0.2, -0.1])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="default lab/studies/align/results/gradient_check_<setting>.json")
    args = parser.parse_args(argv)

    import torch

    from dalle_lab.align.config import to_dict

    torch.set_num_threads(args.threads)
    trainer, pool = make_trainer(args.dalle_path, args.setting, args.batch // args.group, args.group, args.seed,
                                 "/tmp/align_gradient_check")
    config = trainer.config
    started = time.time()
    params = [p for p in trainer.dalle.parameters() if p.requires_grad]
    gradient, train_reward = batch_gradient(trainer, trainer.epoch_prompts(0), 1000, params)
    params = [p for p in params if p.grad is not None]
    norm = gradient.norm()
    direction = -gradient / norm  # the losses are minimised: ascent on the reward is minus the gradient
    start = [p.detach().clone() for p in params]
    # other captions than the gradient's: the next epoch's draw (as many as the gradient had), else the pool in order
    eval_prompts = (trainer.epoch_prompts(1)[:args.eval] if args.eval <= args.batch
                    else [pool[i % len(pool)] for i in range(args.eval)])

    def expected_reward():
        scores = []
        with torch.no_grad():
            for chunk, begin in enumerate(range(0, len(eval_prompts), 128)):
                prompts = eval_prompts[begin:begin + 128]
                tokens, _, _ = trainer.sample_tokens(trainer.tokenize(prompts), trainer.chunk_generator(77, chunk))
                scores.append(trainer.reward(trainer.dalle.vae.decode(tokens), prompts).float().cpu())
        return torch.cat(scores)

    def move_to(eta: float, direction=direction):
        with torch.no_grad():
            offset = 0
            for p, p0 in zip(params, start):
                p.copy_(p0 + eta * direction[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    before = expected_reward()
    steps = []
    for eta in args.etas:
        move_to(eta)
        after = expected_reward()
        diff = after - before
        steps.append({"eta": eta, "reward": float(after.mean()), "difference": float(diff.mean()),
                      "difference_se": float(diff.std() / len(diff) ** 0.5)})
        print(f"eta {eta:+.3f}: reward {after.mean():.4f} (start {before.mean():.4f}), difference "
              f"{diff.mean():+.4f} +- {steps[-1]['difference_se']:.4f}", flush=True)
    # control: a random direction of the same length (a Gaussian, normalised), to tell "this direction is downhill"
    # from "any step of this size lowers the reward"
    noise = torch.randn(direction.shape, generator=torch.Generator().manual_seed(args.seed))
    random_steps = []
    for eta in [e for e in args.etas if e > 0][:2]:
        move_to(eta, noise / noise.norm())
        diff = expected_reward() - before
        random_steps.append({"eta": eta, "difference": float(diff.mean()),
                             "difference_se": float(diff.std() / len(diff) ** 0.5)})
        print(f"random direction, eta {eta:+.3f}: difference {diff.mean():+.4f} +- "
              f"{random_steps[-1]['difference_se']:.4f}", flush=True)
    move_to(0.0)
    record = {"command": ["python", *sys.argv], "git": git_commit(), "dalle_path": args.dalle_path,
              "dalle_sha256": hashlib.sha256(Path(args.dalle_path).read_bytes()).hexdigest(),
              "setting": args.setting, "config": to_dict(config), "batch": args.batch, "group": args.group,
              "eval_images": len(eval_prompts), "seed": args.seed, "threads": args.threads,
              "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "gradient_norm": float(norm), "train_batch_reward": train_reward, "start_reward": float(before.mean()),
              "steps": steps, "random_direction_steps": random_steps, "seconds": time.time() - started}
    write_results(record, args.out or f"lab/studies/align/results/gradient_check_{args.setting}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
