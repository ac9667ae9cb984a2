"""Train an image tokenizer (a taming-transformers VQGAN) and save it in taming's format.
Installed as the console script `dalle-train-vae`; `python train_vae.py` in a checkout runs the same.

    python train_vae.py                                # the default Shapes tokenizer (32 px -> 8x8 tokens, 512 codes)
    python train_vae.py --data photos --image_size 64 --steps 20000 --out_dir runs/my_vae
    python train_vae.py --data 'shards/train-{000..009}.tar' --val_data shards/val-000.tar --gumbel

Every flag and its default come from dalle_lab.vae.train.VAETrainConfig. Re-running with the same --out_dir resumes.
At the end it prints the reconstruction quality on held-out images, the seconds per 1000 steps and the flags that
load the result into train_dalle.py (docs/vae.md, docs/own_data.md).
"""
import argparse
import dataclasses
import sys
import typing


def build_parser() -> argparse.ArgumentParser:
    from dalle_lab.vae.train import VAETrainConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    hints = typing.get_type_hints(VAETrainConfig)
    for field in dataclasses.fields(VAETrainConfig):
        hint, default, flag = hints[field.name], field.default, f"--{field.name}"
        if hint is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif typing.get_origin(hint) is tuple:
            parser.add_argument(flag, type=int, nargs="+", default=list(default), metavar="N")
        else:
            # "int | None" and friends: the non-None member is the value type
            kind = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
            parser.add_argument(flag, type=kind, default=default, help=f"default: {default}")
    return parser


def main(argv=None) -> int:
    from dalle_lab.vae.train import VAETrainConfig, summary, train_vae

    args = build_parser().parse_args(argv)
    try:
        metrics = train_vae(VAETrainConfig(**vars(args)))
    except (ValueError, FileNotFoundError, RuntimeError) as err:  # bad data or settings: one line, no traceback
        print(f"train_vae.py: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    print(summary(metrics))
    return 0


if __name__ == "__main__":  # python -m dalle_lab.cli.train_vae (torchrun -m, deepspeed --module)
    from dalle_lab.cli import run

    sys.exit(run(main))
