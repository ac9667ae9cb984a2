"""Train a DALLE. With no flags: the built-in Shapes data, the default image tokenizer and the shipped vocabulary.
Installed as the console script `dalle-train`; `python train_dalle.py` in a checkout runs the same.

    python train_dalle.py                                   # the main job (CPU, about 10 minutes)
    python train_dalle.py --amp --loss_img_weight 1         # bf16 autocast, CogView's loss weighting
    python train_dalle.py --distributed_backend deepspeed --amp
    torchrun --nproc_per_node 2 train_dalle.py ...          # two processes (or: deepspeed --num_accelerators 2 ...)
    python train_dalle.py --resume                          # continue runs/dalle/dalle.pt exactly (its flags)

All flags: python train_dalle.py --help. Everything else lives in dalle_lab.training (see docs/training.md).
"""
import sys

from dalle_lab.training.cli import build_train_parser, config_from_args, epochs_end_the_run, given_flags
from dalle_lab.training.dallepytorch_flags import apply_train_flags


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_train_parser().parse_args(argv)
    try:  # DALLE-pytorch's own flags (--fp16, --reversible, ...): translated with a note, or refused in one line
        for note in apply_train_flags(args):
            print(f"train_dalle.py: note: {note}", file=sys.stderr)
    except ValueError as err:  # FlagError, or a --device that is not here
        print(f"train_dalle.py: error: {err}", file=sys.stderr)
        return 2
    cfg, model_overrides = config_from_args(args)
    cfg = epochs_end_the_run(cfg, given_flags(argv))

    from dalle_lab.training.checkpoint import read_checkpoint
    from dalle_lab.training.errors import CheckpointError, NonFiniteLossError
    from dalle_lab.training.loop import train
    from dalle_lab.training.run_setup import resume_path
    from dalle_lab.training.resume import settings_from_checkpoint

    try:
        if cfg.resume:  # flags left out continue as the saved run had them; flags given must match it
            cfg, model_overrides = settings_from_checkpoint(cfg, model_overrides, given_flags(argv),
                                                            read_checkpoint(resume_path(cfg)))
        result = train(cfg, model_overrides)
    except (CheckpointError, NonFiniteLossError, FileNotFoundError, ValueError) as err:
        print(f"train_dalle.py: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the second Ctrl-C: the loop has said which checkpoint is kept
        return 130
    from dalle_lab.training.distributed import env_dist_info

    if result.checkpoint_path and env_dist_info().is_main:
        print(f"checkpoint: {result.checkpoint_path}")
        caption = "a caption like your data's" if cfg.image_text_folder else "a red circle"
        print(f"generate:   python generate.py --dalle_path {result.checkpoint_path} --text \"{caption}\"")
    return 130 if result.stopped_because == "interrupted" else 0  # 128 + SIGINT, as shells report an interrupt


if __name__ == "__main__":  # python -m dalle_lab.cli.train_dalle (torchrun -m, deepspeed --module)
    from dalle_lab.cli import run

    sys.exit(run(main))
