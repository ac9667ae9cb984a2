"""Fine-tune a trained DALLE on a reward: `python -m dalle_lab.align --dalle_path runs/dalle/dalle.pt ...`.

    python -m dalle_lab.align --dalle_path runs/dalle/dalle.pt --reward jpeg_compressibility --prompts prompts.txt
    python -m dalle_lab.align --dalle_path runs/dalle/dalle.pt --reward shapes_faithfulness --prompts heldout \
        --time_budget_s 900
    python -m dalle_lab.align --dalle_path runs/dalle/dalle.pt --method reward_backprop \\
        --reward negative_total_variation --backprop_last_k 16
    python -m dalle_lab.align --dalle_path ... --reward aesthetic --clip_path /models/clip-vit-large-patch14 \\
        --aesthetic_head_path sac+logos+ava1-l14-linearMSE.pth --reward_precision tpu_default

Without --prompts the prompts are Shapes training-split captions; --prompts heldout takes the captions of the held-out
colour-shape pairs from the Shapes grammar (dalle_lab/align/prompts.py). Re-running with the same --out_dir resumes.
Every AlignConfig field is a flag with the same default (python -m dalle_lab.align --help); docs/align.md explains
the methods.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

import torch

from dalle_lab.align.best_of_n import BestOfNTrainer
from dalle_lab.align.config import PRESETS, AlignConfig
from dalle_lab.align.policy_gradient import PolicyGradientTrainer
from dalle_lab.align.prompts import HELDOUT, heldout_protocol, pair_names
from dalle_lab.align.reward_backprop import RewardBackpropTrainer
from dalle_lab.data.shapes import ShapesDataset
from dalle_lab.training.captions import warn_unknown_words
from dalle_lab.training.checkpoint import CheckpointError, load_dalle
from dalle_lab.training.distributed import env_dist_info, process_device
from dalle_lab.utils import pick_device

TRAINERS = {"policy_gradient": PolicyGradientTrainer, "reward_backprop": RewardBackpropTrainer,
            "best_of_n": BestOfNTrainer}

_HELP = {
    "method": "policy_gradient (PPO over image tokens, any reward), reward_backprop (differentiable rewards) or "
              "best_of_n (cross-entropy on each group's best samples)",
    "reward": "a reward name or weighted sum, e.g. jpeg_compressibility or jpeg_compressibility:1+shapes_faithfulness:2",
    "time_budget_s": "seconds of fine-tuning: no epoch starts that would end past it (judged by the last epoch); "
                     "without --epochs the run goes on until it",
    "epochs": "epochs of fine-tuning (default: until --time_budget_s, or 20 without one); with both, whichever "
              "ends first ends the run, and the log says which",
    "kl_target": "adaptive KL: nats per image to hold the KL to the starting model near (kl_coef is its start)",
    "eval_every": "evaluate on the eval prompts every N epochs (0: only before and after)",
    "lora_rank": "0 fine-tunes every weight; >0 trains only LoRA adapters of this rank",
    "trainable": "all, or blocks: only the transformer blocks learn (embeddings and logit heads frozen)",
    "credit": "policy gradient: uniform (every token shares its image's advantage), localized (each part of the "
              "reward to the tokens its credit map names: the Shapes checker's attributes to the cells of the object "
              "judged) or content (cells that differ from the plain background)",
    "adv_std": "group advantages over the std of the group's rewards (GRPO) or of the whole batch's (Flow-GRPO)",
    "drop_flat_groups": "leave groups whose rewards have no spread out of the update (DAPO)",
    "guidance_grad": "with guidance: the gradient moves both branches, or the captioned (conditional) one only",
    "screen_samples": "keep RL prompts whose exact-match rate over K samples lies in (0, 0.9) (0: keep all)",
    "eval_samples": "samples of every evaluation caption (>= 2 also measures pixel diversity per caption)",
    "eval_at_start": "evaluate the starting model before the first update (false only where the same start "
                     "evaluation exists: same model, evaluation sets, sampling and threads)",
    "advantage": "per_prompt (DDPO's running per-prompt statistics) or group (GRPO normalisation within the epoch)",
    "backprop_last_k": "reward_backprop: the gradient reaches the model through the last K image tokens",
    "reward_precision": "run the reward model in fp32, bf16, fp16 or tpu_default (aesthetic, clip_score)",
}


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_optional(kind):
    def parse(text: str):
        return None if text.lower() in ("none", "") else kind(text)

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dalle_lab.align", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dalle_path", required=True, help="a DALLE checkpoint (train_dalle.py's .pt)")
    parser.add_argument("--preset", default=None, choices=sorted(PRESETS),
                        help="named settings for a goal (AlignConfig PRESETS; explicit flags override them): "
                             "faithfulness = GRPO on the Shapes checker, see docs/align.md")
    parser.add_argument("--prompts", default=None,
                        help=f"text file with one caption per line, or '{HELDOUT}': every caption of the held-out "
                             f"colour-shape pairs in the Shapes grammar less the evaluation captions (default: Shapes "
                             f"training-split captions)")
    parser.add_argument("--leave_out_pair", default=None,
                        help=f"with --prompts {HELDOUT}: leave one pair ({', '.join(pair_names())}) out of the RL "
                             f"prompts and evaluate on its captions (the 'left_out' set)")
    parser.add_argument("--num_shapes_prompts", type=int, default=2000,
                        help="without --prompts: how many Shapes training-split items' captions to use as RL prompts "
                             "(many distinct prompts: the policy must learn the grammar, not a few captions)")
    parser.add_argument("--eval_prompts", default=None,
                        help="text file of captions scored during the run, never used as RL prompts (default: Shapes "
                             "validation captions and held-out compositions, when the RL prompts are Shapes captions)")
    parser.add_argument("--out_dir", default="runs/align", help="logs, plots, resumable state, dalle_aligned.pt")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no_resume", action="store_true", help="start afresh even if out_dir holds a state file")
    parser.add_argument("--clip_path", default=None, help="aesthetic reward: local CLIP ViT-L/14 (transformers dir)")
    parser.add_argument("--aesthetic_head_path", default=None, help="aesthetic reward: the LAION head .pth")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    # the deepspeed launcher passes --local_rank to every process; LOCAL_RANK in the environment says the same
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    for f in fields(AlignConfig):
        # config.py uses `from __future__ import annotations`, so f.type is the annotation's text: "int | None"
        base, _, rest = f.type.partition("|")
        kind = {"int": int, "float": float, "str": str, "bool": _parse_bool}[base.strip()]
        parser.add_argument(f"--{f.name}", type=_parse_optional(kind) if "None" in rest else kind,
                            default=f.default, help=_HELP.get(f.name, " "))
    return parser


def read_prompts(args, config: AlignConfig) -> tuple[list[str], dict[str, list[str]] | None]:
    """(RL prompts, evaluation sets or None for the defaults) from --prompts, --leave_out_pair, --eval_prompts."""
    if args.leave_out_pair and args.prompts != HELDOUT:
        raise ValueError(f"--leave_out_pair needs --prompts {HELDOUT} (it chooses which held-out pair RL never sees)")
    eval_sets = {"prompts": read_caption_file(args.eval_prompts, "--eval_prompts")} if args.eval_prompts else None
    if args.prompts == HELDOUT:
        prompts, protocol_sets = heldout_protocol(config, args.leave_out_pair)
        return prompts, eval_sets or protocol_sets
    if args.prompts:
        return read_caption_file(args.prompts, "--prompts"), eval_sets
    dataset = ShapesDataset("train", length=args.num_shapes_prompts, seed=0)
    return [dataset.caption(i) for i in range(len(dataset))], eval_sets


def read_caption_file(path_text: str, flag: str) -> list[str]:
    path = Path(path_text)
    if not path.is_file():
        raise FileNotFoundError(f"{flag} {path}: no such file (give a text file with one caption per line)")
    captions = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not captions:
        raise ValueError(f"{flag} {path} holds no captions (one caption per line expected)")
    return captions


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The flags, with a --preset's values as the defaults under the explicit flags."""
    args = parser.parse_args(argv)
    if args.preset:  # the preset's values become the defaults, then the explicit flags are parsed again on top
        parser.set_defaults(**PRESETS[args.preset])
        args = parser.parse_args(argv)
    return args


def main(argv=None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(parser, argv)
    try:
        config = AlignConfig(**{f.name: getattr(args, f.name) for f in fields(AlignConfig)})
    except ValueError as err:  # a bad flag value: argparse's usage message and exit status 2
        parser.error(str(err))

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        prompts, eval_sets = read_prompts(args, config)
        device = process_device(pick_device(args.device), env_dist_info())  # torchrun / deepspeed: one GPU each
        dalle, tokenizer, _ = load_dalle(args.dalle_path, device)
        warn_unknown_words(tokenizer, prompts, "python -m dalle_lab.align")  # named; the run goes on
        reward_options = {"clip_path": args.clip_path, "head_path": args.aesthetic_head_path, "device": device}
        trainer = TRAINERS[config.method](dalle, tokenizer, config, prompts, args.out_dir, reward_options=reward_options,
                          resume=not args.no_resume, eval_sets=eval_sets, argv=argv)
        history = trainer.train()
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        print(f"python -m dalle_lab.align: error: {err}", file=sys.stderr)
        return 1
    if not trainer.processes.is_main:  # process 0 reports for all
        return 0
    if history:
        first, last = history[0], history[-1]
        print(f"[align] reward {first['reward_mean']:.4f} -> {last['reward_mean']:.4f} over {last['epoch'] + 1} "
              f"epochs ({last['images_sampled']} images, {last['elapsed_s']:.0f}s)")
    out = Path(args.out_dir)
    print(f"[align] model: {out / 'dalle_aligned.pt'}  curve: {out / 'reward_curve.png'}  "
          f"samples: {out / 'samples_before.png'}, {out / 'samples_after.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
