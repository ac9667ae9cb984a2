"""The flags of `python -m dalle_lab.align` (dalle-align): every AlignConfig field with the same default, the run's
files and the shared vocabulary's names (dalle_lab/flags.py: --learning_rate / --lr, --output_dir / --out_dir, ...).
"""
from __future__ import annotations

import argparse
from dataclasses import fields

from dalle_lab.align.config import CREDITS, DEFAULT_EPOCHS, METHODS, PRESETS, TRAINABLE, AlignConfig
from dalle_lab.align.prompts import HELDOUT, pair_names
from dalle_lab.flags import (CLIP_GRAD_NORM, GA_STEPS, LEARNING_RATE, OUTPUT_DIR, ZERO_STAGE, HelpFormatter,
                             resume_flags, time_limit_flags)
from dalle_lab.numerics import PRECISION_MODES
from dalle_lab.rewards.registry import REWARD_NAMES

USAGE = """Fine-tune a trained DALLE on a reward: `python -m dalle_lab.align --dalle_path runs/dalle/dalle.pt ...`.

    python -m dalle_lab.align --dalle_path runs/dalle/dalle.pt --reward jpeg_compressibility --prompts prompts.txt
    python -m dalle_lab.align --dalle_path runs/dalle/dalle.pt --reward shapes_faithfulness --prompts heldout \\
        --max_minutes 15
    python -m dalle_lab.align --dalle_path runs/dalle/dalle.pt --method reward_backprop \\
        --reward negative_total_variation --backprop_last_k 16
    python -m dalle_lab.align --dalle_path ... --reward aesthetic --clip_path /models/clip-vit-large-patch14 \\
        --aesthetic_head_path sac+logos+ava1-l14-linearMSE.pth --reward_precision tpu_default

Without --prompts the prompts are Shapes training-split captions; --prompts heldout takes the captions of the held-out
colour-shape pairs from the Shapes grammar (dalle_lab/align/prompts.py). Re-running with the same --output_dir
continues the run it holds (the same base checkpoint and reward; --overwrite starts afresh).
Every AlignConfig field is a flag with the same default (python -m dalle_lab.align --help); docs/align.md explains
the methods.
"""

FLAG_NAMES = {"lr": LEARNING_RATE, "max_grad_norm": CLIP_GRAD_NORM, "gradient_accumulation_steps": GA_STEPS,
              "deepspeed_zero_stage": ZERO_STAGE}
HELP = {
    "method": f"{'|'.join(METHODS)}: policy_gradient (PPO over image tokens, any reward), reward_backprop "
              "(differentiable rewards) or best_of_n (cross-entropy on each group's best samples)",
    "reward": f"a reward name or a weighted sum of names (a:1+b:0.5); the names: {', '.join(REWARD_NAMES)} "
              "(aesthetic needs --clip_path)",
    "epochs": f"epochs of fine-tuning (default: until the time limit, or {DEFAULT_EPOCHS} without one); with both, "
              "whichever ends first ends the run, and the log says which",
    "prompts_per_epoch": "prompts sampled per epoch", "group_size": "images per prompt per epoch (GRPO's group)",
    "sample_batch_size": "images sampled at once", "train_batch_size": "images per update micro-batch per process",
    "lr": "learning rate", "optimizer": "adamw or sgd (with --momentum; docs/align.md says when it matters)",
    "momentum": "SGD momentum", "weight_decay": "weight decay",
    "max_grad_norm": "clip the gradient norm to this", "kl_coef": "per-token KL penalty to the frozen starting model "
    "(the start value with --kl_target)",
    "kl_target": "adaptive KL: nats per image to hold the KL to the starting model near (none: a fixed --kl_coef)",
    "kl_horizon": "adaptive KL: the coefficient moves by at most 20%% per this many images",
    "seed": "random seed", "lora_rank": "0 fine-tunes every weight; >0 trains only LoRA adapters of this rank",
    "trainable": f"{'|'.join(TRAINABLE)}: blocks = only the transformer blocks learn (embeddings and logit heads "
                 "frozen)",
    "best_of_n_min_reward": "best_of_n: keep a group's best only when it scores at least this (none: always)",
    "lora_alpha": "LoRA scale alpha", "deepspeed_zero_stage": "0, 1 or 2: DeepSpeed's engine at that ZeRO stage "
    "(none: plain PyTorch)",
    "temperature": "sampling temperature (the policy's distribution)", "top_k": "sampling top-k over the image "
    "vocabulary (none: off)", "top_p": "nucleus sampling threshold (none: off)",
    "cond_scale": "classifier-free guidance scale while sampling (1: off)",
    "eval_every": "evaluate on the eval prompts every N epochs (0: only before and after)",
    "eval_num_prompts": "validation captions in the in-run evaluation (never RL prompts)",
    "eval_num_heldout": "Shapes held-out compositions in the evaluation (0: none)",
    "eval_loss_images": "real validation images for the image loss (forgetting; 0: skip)",
    "eval_diversity_samples": "samples of one caption for the diversity measures (0: skip)",
    "eval_temperature": "evaluation sampling temperature", "eval_top_k": "evaluation top-k (none: off)",
    "eval_cond_scale": "evaluation guidance scale",
    "inner_epochs": "policy gradient: update passes over each epoch's samples",
    "credit": f"policy gradient, {'|'.join(CREDITS)}: uniform (every token shares its image's advantage), localized "
              "(each part of the reward to the tokens its credit map names: the Shapes checker's attributes to the "
              "cells of the object judged) or content (cells that differ from the plain background)",
    "adv_std": "group advantages over the std of the group's rewards (group: GRPO) or of the whole batch's (batch: "
               "Flow-GRPO)",
    "drop_flat_groups": "leave groups whose rewards have no spread out of the update (DAPO); true or false",
    "diversity_weight": "policy gradient: among each group's best samples, add this times each one's mean pixel "
                        "distance to the others (centred: it sums to zero in the group), so equally good images "
                        "unlike the rest are preferred; 0 turns it off",
    "guidance_grad": "with guidance: the gradient moves both branches, or the captioned (conditional) one only",
    "screen_samples": "keep RL prompts whose exact-match rate over K samples lies in (0, 0.9) (0: keep all)",
    "eval_samples": "samples of every evaluation caption (>= 2 also measures pixel diversity per caption)",
    "eval_at_start": "evaluate the starting model before the first update (false only where the same start "
                     "evaluation exists: same model, evaluation sets, sampling and threads); true or false",
    "clip_range": "PPO ratio clip range",
    "advantage": "group (GRPO normalisation within the epoch) or per_prompt (DDPO's running per-prompt statistics)",
    "adv_clip_max": "clip advantages to +-this (none: no clipping)",
    "stat_buffer_size": "per_prompt advantages: rewards kept per prompt",
    "stat_min_count": "per_prompt advantages: rewards a prompt needs before its own statistics are used",
    "backprop_last_k": "reward_backprop: the gradient reaches the model through the last K image tokens",
    "gumbel_tau": "reward_backprop: Gumbel-softmax temperature",
    "reward_precision": f"run the reward model in {', '.join(PRECISION_MODES)} (aesthetic, clip_score)",
    "reward_gap_fraction": "share of samples also scored in fp32 to measure the precision gap",
    "reward_gap_warn": "warn when the mean |score(precision) - score(fp32)| exceeds this",
    "kl_distribution": "sampling (the sampler's guided, truncated distributions) or conditional (plain conditional "
                       "next-token distributions)",
    "gradient_accumulation_steps": "micro-batches per optimizer step (summed, then all-reduced once)",
    "backprop_last_k_min": "reward_backprop: draw K uniformly from [this, backprop_last_k] each step (none: always "
                           "backprop_last_k)",
    "backprop_chain_depth": "reward_backprop: links of the chain the gradient follows in the window (none: all)",
    "backprop_checkpoint": "reward_backprop: 1 recomputes each pass in the backward (less memory)",
}
TIME_HELP = ("fine-tuning time limit: no epoch starts that would end past it (judged by the last epoch); without "
             "--epochs the run goes on until it")
RESUME_HELP = ("continue the run --output_dir holds (what happens without the flag too; with it, a folder holding no "
               "run is an error)")
OVERWRITE_HELP = ("start afresh even though --output_dir holds a run (another base checkpoint or reward is refused "
                  "otherwise); its state and logs are replaced")


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


_parse_bool.__name__ = "true or false"


def _parse_optional(kind):
    def parse(text: str):
        return None if text.lower() in ("none", "") else kind(text)

    parse.__name__ = f"{kind.__name__} or none"
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dalle_lab.align", description=USAGE,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--dalle_path", required=True, help="the DALLE checkpoint to fine-tune (train_dalle.py's .pt)")
    parser.add_argument("--preset", default=None, choices=sorted(PRESETS),
                        help="named settings for a goal (AlignConfig PRESETS; explicit flags override them): "
                             "faithfulness = GRPO on the Shapes checker, see docs/align.md")
    parser.add_argument("--prompts", default=None,
                        help=f"text file with one caption per line, or '{HELDOUT}': every caption of the held-out "
                             f"colour-shape pairs in the Shapes grammar less the evaluation captions (default: Shapes "
                             f"training-split captions)")
    parser.add_argument("--leave_out_pair", default=None,
                        help=f"with --prompts {HELDOUT}: leave one pair ({', '.join(pair_names())}) out of the RL "
                             f"prompts and evaluate on its captions (the 'left_out' set; none: no pair left out)")
    parser.add_argument("--num_shapes_prompts", type=int, default=2000,
                        help="without --prompts: how many Shapes training-split items' captions to use as RL prompts "
                             "(many distinct prompts: the policy must learn the grammar, not a few captions)")
    parser.add_argument("--eval_prompts", default=None,
                        help="text file of captions scored during the run, never used as RL prompts (default: Shapes "
                             "validation captions and held-out compositions, when the RL prompts are Shapes captions)")
    parser.add_argument(*OUTPUT_DIR, dest="out_dir", default="runs/align",
                        help="the run's folder: run.json, logs, plots, resumable state, dalle_aligned.pt")
    resume_flags(parser, RESUME_HELP, OVERWRITE_HELP)
    parser.add_argument("--device", default="auto", help="auto|cpu|cuda")
    parser.add_argument("--clip_path", default=None, help="aesthetic reward: local CLIP ViT-L/14 (transformers dir)")
    parser.add_argument("--aesthetic_head_path", default=None, help="aesthetic reward: the LAION head .pth")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (none: torch's choice)")
    parser.add_argument("--wandb_name", default=None,
                        help="log each epoch to wandb under this run name (off unless given; WANDB_MODE=offline|"
                             "disabled honoured)")
    parser.add_argument("--wandb_entity", default=None, help="wandb entity")
    parser.add_argument("--wandb_project", default="dalle_lab", help="wandb project")
    # the deepspeed launcher passes --local_rank to every process; LOCAL_RANK in the environment says the same
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    time_limit_flags(parser, "time_budget_s", "seconds", help=TIME_HELP)
    for f in fields(AlignConfig):
        if f.name == "time_budget_s":
            continue
        # config.py uses `from __future__ import annotations`, so f.type is the annotation's text: "int | None"
        base, _, rest = f.type.partition("|")
        kind = {"int": int, "float": float, "str": str, "bool": _parse_bool}[base.strip()]
        # a bool takes a value (--eval_at_start false), or none for true (--drop_flat_groups)
        extra = {"nargs": "?", "const": True} if kind is _parse_bool else {}
        parser.add_argument(*FLAG_NAMES.get(f.name, (f"--{f.name}",)), dest=f.name,
                            type=_parse_optional(kind) if "None" in rest else kind, default=f.default,
                            help=HELP[f.name], **extra)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The flags, with a --preset's values as the defaults under the explicit flags."""
    args = parser.parse_args(argv)
    if args.preset:  # the preset's values become the defaults, then the explicit flags are parsed again on top
        parser.set_defaults(**PRESETS[args.preset])
        args = parser.parse_args(argv)
    return args
