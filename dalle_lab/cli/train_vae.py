"""Train an image tokenizer (a taming-transformers VQGAN) and save it in taming's format.
Installed as the console script `dalle-train-vae`; `python train_vae.py` in a checkout runs the same.

    python train_vae.py                                # the default Shapes tokenizer (32 px -> 8x8 tokens, 512 codes)
    python train_vae.py --data photos --image_size 64 --max_steps 20000 --output_dir runs/my_vae
    python train_vae.py --data 'shards/train-{000..009}.tar' --val_data shards/val-000.tar --gumbel

Every flag and its default come from dalle_lab.vae.train.VAETrainConfig. Re-running with the same --output_dir
continues the run it holds (--overwrite starts afresh; docs/training.md, 'One resume rule'). At the end it prints the
reconstruction quality on held-out images, the seconds per 1000 steps and the flags that load the result into
train_dalle.py (docs/vae.md, docs/own_data.md).
"""
import argparse
import dataclasses
import sys
import typing
from pathlib import Path

from dalle_lab.flags import (AMP, LEARNING_RATE, MAX_STEPS, OUTPUT_DIR, PRECISION, BooleanFlag, HelpFormatter,
                             resume_flags)

PROG = "train_vae.py"
# --image_folder: DALLE-pytorch's train_vae.py name for the data (its other spellings here: --amp, the older names)
FLAG_NAMES = {"out_dir": OUTPUT_DIR, "lr": LEARNING_RATE, "steps": MAX_STEPS, "precision": (PRECISION,),
              "data": ("--data", "--image_folder")}
HELP = {
    "image_size": "image side in pixels (square); a multiple of the downsampling factor",
    "n_embed": "codebook size: the image vocabulary train_dalle.py models",
    "embed_dim": "codebook vector width (with --gumbel: set to --z_channels)",
    "z_channels": "encoder output channels", "ch": "base channel count (a multiple of 32)",
    "ch_mult": "channel multiplier per resolution; len - 1 halvings (1 2 2: 32 px -> 8x8 tokens)",
    "num_res_blocks": "residual blocks per resolution", "gumbel": "taming's GumbelVQ instead of VQModel",
    "data": "shapes|emoji (built-in), a folder of images (every image, captioned or not), or WebDataset shards "
            "(.tar, brace patterns work)",
    "val_data": "held-out shards (folders and built-in data hold out --val_size images themselves)",
    "val_size": "held-out images for the reconstruction quality", "seed": "random seed",
    "steps": "optimizer steps in all (a resumed run trains up to this count)", "batch_size": "images per step",
    "lr": "peak learning rate (AdamW)", "warmup_steps": "linear warm-up steps",
    "min_lr_ratio": "the cosine decay ends at learning_rate x this", "l1_weight": "L1 reconstruction weight",
    "l2_weight": "L2 reconstruction weight", "commitment": "commitment loss weight",
    "codebook": "ema (EMA of the assigned encoder outputs) or grad (taming's codebook loss)",
    "ema_decay": "codebook EMA decay", "restart_every": "steps between dead-code restarts (0: never; VQModel only)",
    "temperature_start": "GumbelVQ: the first temperature", "temperature_end": "GumbelVQ: the last temperature",
    "kl_weight": "GumbelVQ: the KL weight", "disc_weight": "PatchGAN discriminator weight (0: none)",
    "disc_start": "the step the discriminator starts at",
    "lpips_path": "a TorchScript module lpips(x, y) on images in [-1, 1] (weights you supply; none: no perceptual "
                  "term)", "lpips_weight": "perceptual term weight",
    "out_dir": "the run's folder: vqgan.ckpt, vqgan.yaml, last.ckpt, samples/, metrics.jsonl",
    "val_every": "steps between validations (0: only at the end)",
    "sample_every": "steps between reconstruction grids (0: only at the end)",
    "save_every": "steps between last.ckpt saves (0: only at the end)",
    "export_half": "store the exported tokenizer's weights in fp16 (half the size, the same tokens)",
    "precision": "auto (bf16 autocast where the CPU or GPU computes bfloat16 natively, else fp32), bf16 or fp32",
    "threads": "torch CPU threads (none: torch's default)", "device": "auto|cpu|cuda",
    "progress": "show the progress bar",
    "wandb_name": "log to wandb under this run name (off unless given; WANDB_MODE=offline|disabled honoured)",
    "wandb_entity": "wandb entity", "wandb_project": "wandb project",
}
RESUME_HELP = ("continue the run --output_dir holds (what happens without the flag too; with it, a folder holding no "
               "run is an error)")
OVERWRITE_HELP = "start afresh even though --output_dir holds a run: its last.ckpt, metrics and samples are replaced"


class _Amp(BooleanFlag):
    """DALLE-pytorch's --amp / --no-amp: --precision auto / fp32."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.precision = "fp32" if option_string in self.negatives else "auto"


def build_parser() -> argparse.ArgumentParser:
    from dalle_lab.vae.train import VAETrainConfig

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=HelpFormatter)
    hints = typing.get_type_hints(VAETrainConfig)
    for field in dataclasses.fields(VAETrainConfig):
        if field.name == "resume":
            resume_flags(parser, RESUME_HELP, OVERWRITE_HELP, resume_dest="continue_run")
            continue
        hint, default = hints[field.name], field.default
        flags, help_text = FLAG_NAMES.get(field.name, (f"--{field.name}",)), HELP[field.name]
        if hint is bool:
            parser.add_argument(*flags, dest=field.name, action=BooleanFlag, default=default, help=help_text)
        elif typing.get_origin(hint) is tuple:
            parser.add_argument(*flags, dest=field.name, type=int, nargs="+", default=list(default), metavar="N",
                                help=help_text)
        else:
            # "int | None" and friends: the non-None member is the value type
            kind = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
            parser.add_argument(*flags, dest=field.name, type=kind, default=default, help=help_text)
    parser.add_argument(AMP, action=_Amp, dest="precision", default=argparse.SUPPRESS,
                        help="DALLE-pytorch's spelling: --amp is --precision auto, --no-amp is --precision fp32 "
                             "(default: as --precision)")
    return parser


def config_from_args(args: argparse.Namespace):
    """VAETrainConfig from the flags. An impossible value, or --resume with nothing to continue, is a ValueError
    naming the flag and the fix."""
    from dalle_lab.vae.train import VAETrainConfig

    values = vars(args).copy()
    continue_run, overwrite = values.pop("continue_run"), values.pop("overwrite")
    if continue_run and overwrite:
        raise ValueError("--resume continues the run in --output_dir and --overwrite replaces it: give one")
    if continue_run and not (Path(values["out_dir"]) / "last.ckpt").is_file():
        raise ValueError(f"--resume: {values['out_dir']} holds no run to continue (no last.ckpt); leave --resume out "
                         "to start one there, or give the --output_dir of the run")
    return VAETrainConfig(**values, resume=not overwrite)


def main(argv=None) -> int:
    """Train; a user's mistake (a flag value, the data, the folder) is one line on stderr and exit status 2."""
    from dalle_lab.vae.train import summary, train_vae

    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
        metrics = train_vae(cfg)
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as err:
        print(f"{PROG}: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the state saved last (--save_every) stays valid
        last = Path(args.out_dir) / "last.ckpt"
        kept = f"{last} is kept: the same command continues from it" if last.is_file() else "nothing was saved yet"
        print(f"{PROG}: interrupted; {kept}", file=sys.stderr)
        return 130
    print(summary(metrics))
    return 0


if __name__ == "__main__":  # python -m dalle_lab.cli.train_vae (torchrun -m, deepspeed --module)
    from dalle_lab.cli import run

    sys.exit(run(main))
