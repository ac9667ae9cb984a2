"""Fine-tune a trained DALLE on a reward: `python -m dalle_lab.align --dalle_path runs/dalle/dalle.pt ...`
(the usage, examples and every flag: dalle_lab/align/command_line.py, `python -m dalle_lab.align --help`)."""
from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path

import torch

from dalle_lab.align.best_of_n import BestOfNTrainer
from dalle_lab.align.command_line import build_parser, parse_args  # noqa: F401  (build_parser: re-exported)
from dalle_lab.align.config import AlignConfig
from dalle_lab.align.policy_gradient import PolicyGradientTrainer
from dalle_lab.align.prompts import HELDOUT, heldout_protocol
from dalle_lab.align.reward_backprop import RewardBackpropTrainer
from dalle_lab.align.run_files import STATE_FILE
from dalle_lab.data.shapes import ShapesDataset
from dalle_lab.training.captions import warn_unknown_words
from dalle_lab.training.checkpoint import CheckpointError, load_dalle
from dalle_lab.training.distributed import env_dist_info, process_device
from dalle_lab.utils import pick_device

TRAINERS = {"policy_gradient": PolicyGradientTrainer, "reward_backprop": RewardBackpropTrainer,
            "best_of_n": BestOfNTrainer}


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


def check_shapes_prompts_fit(args, tokenizer) -> None:
    """The default prompts and --prompts heldout are Shapes captions: refuse them for a model whose vocabulary is not
    the shipped Shapes one (a model of the user's own data), instead of training and evaluating it on Shapes."""
    if args.prompts and args.prompts != HELDOUT:
        return
    from dalle_lab.tokenizers import is_shipped_vocabulary

    if not is_shipped_vocabulary(tokenizer, "shapes"):
        asked = f"--prompts {HELDOUT}" if args.prompts == HELDOUT else "no --prompts (the Shapes training captions)"
        raise ValueError(f"{args.dalle_path} reads text with {tokenizer.path}, not the Shapes vocabulary, but {asked} "
                         "would train and evaluate it on Shapes captions: pass --prompts FILE with your own captions "
                         "(one per line) and --eval_prompts FILE for the evaluation")


def read_caption_file(path_text: str, flag: str) -> list[str]:
    path = Path(path_text)
    if not path.is_file():
        raise FileNotFoundError(f"{flag} {path}: no such file (give a text file with one caption per line)")
    # utf-8-sig: a byte-order mark (Windows editors) is not part of the first caption
    captions = [line.strip() for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
    if not captions:
        raise ValueError(f"{flag} {path} holds no captions (one caption per line expected)")
    return captions


def main(argv=None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(parser, argv)
    try:
        config = AlignConfig(**{f.name: getattr(args, f.name) for f in fields(AlignConfig)})
    except ValueError as err:  # a bad flag value: argparse's usage message and exit status 2
        parser.error(str(err))
    if args.resume and args.overwrite:
        parser.error("--resume continues the run in --output_dir and --overwrite replaces it: give one")

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.resume and not (Path(args.out_dir) / STATE_FILE).is_file():
            raise FileNotFoundError(f"--resume: {args.out_dir} holds no run to continue (no {STATE_FILE}); leave "
                                    "--resume out to start one there, or give the --output_dir of the run")
        prompts, eval_sets = read_prompts(args, config)
        device = process_device(pick_device(args.device), env_dist_info())  # torchrun / deepspeed: one GPU each
        dalle, tokenizer, _ = load_dalle(args.dalle_path, device)
        check_shapes_prompts_fit(args, tokenizer)
        warn_unknown_words(tokenizer, prompts, "python -m dalle_lab.align")  # named; the run goes on
        reward_options = {"clip_path": args.clip_path, "head_path": args.aesthetic_head_path, "device": device}
        wandb = {"name": args.wandb_name, "entity": args.wandb_entity, "project": args.wandb_project}
        trainer = TRAINERS[config.method](dalle, tokenizer, config, prompts, args.out_dir,
                                          reward_options=reward_options, resume=not args.overwrite,
                                          eval_sets=eval_sets, argv=argv, base_checkpoint=args.dalle_path,
                                          wandb=wandb if args.wandb_name else None)
        history = trainer.train()
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        print(f"python -m dalle_lab.align: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the state of the last finished epoch is on disk (align_state.pt)
        print(f"python -m dalle_lab.align: interrupted; the same command continues {args.out_dir} from its last "
              "saved epoch", file=sys.stderr)
        return 130
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
