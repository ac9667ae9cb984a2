"""Train a DALLE. With no flags: the built-in Shapes data, the default image tokenizer and the shipped vocabulary.
Installed as the console script `dalle-train`; `python train_dalle.py` in a checkout runs the same.

    python train_dalle.py                                   # the main job (CPU, about 10 minutes)
    python train_dalle.py --amp --loss_img_weight 1         # bf16 autocast, CogView's loss weighting
    python train_dalle.py --distributed_backend deepspeed --amp
    torchrun --nproc_per_node 2 train_dalle.py ...          # two processes (or: deepspeed --num_accelerators 2 ...)
    python train_dalle.py --resume                          # continue runs/dalle/dalle.pt exactly (its flags)
    python train_dalle.py --overwrite                       # a new run in place of the one runs/dalle holds

The output folder is the run: when <output_dir>/dalle.pt exists, the same command continues it (flags left out are
taken from it, flags given must match), and --overwrite starts afresh (docs/training.md, 'One resume rule').

All flags: python train_dalle.py --help. Everything else lives in dalle_lab.training (see docs/training.md).
"""
import dataclasses
import sys
from pathlib import Path

from dalle_lab.training.cli import (build_train_parser, check_counts, config_from_args, epochs_end_the_run,
                                    given_flags)
from dalle_lab.training.dallepytorch_flags import apply_train_flags
from dalle_lab.utils import generate_command

PROG = "train_dalle.py"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_train_parser().parse_args(argv)
    try:  # DALLE-pytorch's own flags (--fp16, --reversible, ...): translated with a note, or refused in one line
        for note in apply_train_flags(args):
            print(f"{PROG}: note: {note}", file=sys.stderr)
        check_counts(args)  # before anything is loaded: a zero batch or budget is a typo, not a run
        if args.resume and args.overwrite:
            raise ValueError("--resume continues a run and --overwrite replaces the one --output_dir holds: give one")
    except ValueError as err:  # FlagError, or a --device that is not here
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    overwrite = args.overwrite
    cfg, model_overrides = config_from_args(args)
    cfg = epochs_end_the_run(cfg, given_flags(argv))

    from dalle_lab.training.errors import CheckpointError, NonFiniteLossError
    from dalle_lab.training.loop import train

    try:
        cfg, model_overrides = run_to_continue(cfg, model_overrides, given_flags(argv), overwrite)
        result = train(cfg, model_overrides)
    except (CheckpointError, NonFiniteLossError, FileNotFoundError, ValueError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the second Ctrl-C: the loop has said which checkpoint is kept
        return 130
    from dalle_lab.training.distributed import env_dist_info

    if result.checkpoint_path and env_dist_info().is_main:
        print(f"checkpoint: {result.checkpoint_path}")
        caption = ("a red circle" if not cfg.image_text_folder and cfg.dataset == "shapes" else
                   "a caption like your data's")
        print(f"generate:   {generate_command()} --dalle_path {result.checkpoint_path} --text \"{caption}\"")
    return 130 if result.stopped_because == "interrupted" else 0  # 128 + SIGINT, as shells report an interrupt


def run_to_continue(cfg, model_overrides: dict, given: set[str], overwrite: bool):
    """The resume rule (docs/training.md): (cfg, model_overrides) for the run to train, after saying in one line
    which run continues. <output_dir>/<name>.pt holding a run: continued (as a bare --resume), unless --overwrite
    deletes it first; --dalle_path naming another file there is refused rather than replacing that run."""
    from dalle_lab.training.checkpoint import clear_run, is_training_checkpoint, read_checkpoint
    from dalle_lab.training.distributed import env_dist_info
    from dalle_lab.training.resume import (budget_changes, changed_settings, check_resume_settings,
                                           settings_from_checkpoint)
    from dalle_lab.training.run_setup import resume_path

    is_main = env_dist_info().is_main
    latest = Path(cfg.output_dir) / f"{cfg.dalle_output_file_name}.pt"
    fix = f"give another --output_dir, or --overwrite to start afresh in {cfg.output_dir}"
    automatic = not cfg.resume and not overwrite and latest.is_file()
    if overwrite and latest.is_file():
        if is_main:  # the other processes take the same decision and wait for no file
            removed = clear_run(cfg.output_dir, cfg.dalle_output_file_name)
            print(f"{PROG}: --overwrite: a new run in {cfg.output_dir} ({len(removed)} files of the run it held "
                  "deleted)", file=sys.stderr)
        return cfg, model_overrides
    if automatic and cfg.dalle_path:
        if Path(cfg.dalle_path).resolve() != latest.resolve():
            raise ValueError(f"{cfg.output_dir} holds a run ({latest}) and --dalle_path starts another there; {fix}")
        # the folder's own checkpoint named again, as DALLE-pytorch users resume: the same as the command without it
        cfg = dataclasses.replace(cfg, dalle_path=None)
    if automatic:
        cfg = dataclasses.replace(cfg, resume="latest")
    if not cfg.resume:
        if cfg.dalle_path:  # the checkpoint brings its model: only the model flags typed here may change it
            model_overrides = {name: value for name, value in model_overrides.items() if name in given}
        return cfg, model_overrides
    checkpoint = read_checkpoint(resume_path(cfg))
    if automatic and not is_training_checkpoint(checkpoint):
        raise ValueError(f"{latest} holds weights only, not a run to continue; {fix}")
    cfg, model_overrides = settings_from_checkpoint(cfg, model_overrides, given, checkpoint)
    # refused before the line below says it resumes (the engine's own facts are checked again once it is built)
    budget = budget_changes(checkpoint, cfg, given)
    changed = changed_settings(checkpoint, cfg, model_overrides, facts=None) + budget
    if changed and automatic:
        raise ValueError(f"{cfg.output_dir} holds a run ({latest}, step {checkpoint.get('step')}) that these flags "
                         f"would change: {'; '.join(changed)}; leave them out to continue it, or {fix}")
    check_resume_settings(checkpoint, cfg, model_overrides, None, resume_path(cfg), also=budget)
    if is_main:
        how = "the run --output_dir holds" if automatic else "--resume"
        print(f"{PROG}: resuming {resume_path(cfg)} at step {checkpoint.get('step')} ({how}; flags left out are "
              "taken from it, --overwrite starts afresh)", file=sys.stderr)
    return cfg, model_overrides


if __name__ == "__main__":  # python -m dalle_lab.cli.train_dalle (torchrun -m, deepspeed --module)
    from dalle_lab.cli import run

    sys.exit(run(main))
