"""Command line: encode an image-text folder or WebDataset shards once into token shards (dalle_lab.data.pretokenize
does the work; this module chooses the VQGAN the way training does, tokenizer_choice.py).

    python -m dalle_lab.training.pretokenize --image_text_folder data/ --out tokens/ \
        --vqgan_model_path vqgan.ckpt --vqgan_config_path vqgan.yaml
    python -m dalle_lab.training.pretokenize --image_text_folder 'shards/{000..009}.tar' --wds jpg,txt \
        --vqgan_model_path vqgan.ckpt --vqgan_config_path vqgan.yaml --out tokens/ --device cuda
    python train_dalle.py --image_text_folder tokens/ --bpe_path my.model    # no VQGAN encoder while training
"""
from __future__ import annotations

import argparse
import logging
import sys

from dalle_lab.data.pretokenize import pretokenize
from dalle_lab.utils import pick_device

from .tokenizer_choice import image_tokenizer_for_pretokenize


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dalle_lab.training.pretokenize",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--image_text_folder", required=True, help="folder of images + .txt, or shard urls with --wds")
    parser.add_argument("--wds", default=None, help="read WebDataset shards (e.g. jpg,txt, as train_dalle.py)")
    parser.add_argument("--out", required=True, help="output directory (created; a killed run's is continued)")
    parser.add_argument("--vqgan_model_path", default=None, help="taming VQGAN .ckpt")
    parser.add_argument("--vqgan_config_path", default=None, help="taming VQGAN .yaml")
    parser.add_argument("--dataset", default=None, help="without --vqgan_*: use this built-in dataset's VQGAN")
    parser.add_argument("--shard_size", type=int, default=1000, help="images per output shard (folders)")
    parser.add_argument("--batch_size", type=int, default=32, help="images per VQGAN forward")
    parser.add_argument("--num_workers", type=int, default=0, help="image-decoding workers (folders)")
    parser.add_argument("--device", default="auto", help="auto|cpu|cuda")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        vae = image_tokenizer_for_pretokenize(args.image_text_folder, args.vqgan_model_path, args.vqgan_config_path,
                                              args.dataset)
        vae = vae.to(pick_device(args.device))
        pretokenize(args.image_text_folder, args.out, vae, wds=bool(args.wds), shard_size=args.shard_size,
                    batch_size=args.batch_size, num_workers=args.num_workers, progress=args.progress)
    except (FileNotFoundError, ValueError) as error:
        print(f"pretokenize: error: {error}", file=sys.stderr)
        return 1
    print(f"train: python train_dalle.py --image_text_folder {args.out} --bpe_path YOUR_VOCABULARY "
          f"(or --bpe_path auto)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
