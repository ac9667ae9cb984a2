"""python -m dalle_lab.convert dallepytorch IN.pt OUT.pt [--bpe_path ...] [--vqgan_model_path ... --vqgan_config_path ...]

Converts a DALLE-pytorch 1.x train_dalle.py checkpoint into a dalle_lab checkpoint that generate.py, train_dalle.py
--dalle_path and python -m dalle_lab.align accept (docs/migrating.md).
"""
from __future__ import annotations

import argparse
import sys

from dalle_lab.utils import generate_command

from .convert import ConversionError, Sources, convert_file


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dalle_lab.convert", description=__doc__.split("\n\n")[1])
    sub = parser.add_subparsers(dest="source", required=True)
    dp = sub.add_parser("dallepytorch", help="a DALLE-pytorch 1.x train_dalle.py checkpoint")
    dp.add_argument("input", help="the DALLE-pytorch .pt file")
    dp.add_argument("output", help="the dalle_lab checkpoint to write")
    dp.add_argument("--bpe_path", help="its text vocabulary: youtokentome .model, --hug .json, or CLIP's "
                    "bpe_simple_vocab_16e6.txt for DALLE-pytorch's default SimpleTokenizer")
    dp.add_argument("--hug", action="store_true", help="--bpe_path is a HuggingFace tokenizers JSON (as there)")
    dp.add_argument("--vqgan_model_path", help="VQGanVAE models: the taming .ckpt it was trained with")
    dp.add_argument("--vqgan_config_path", help="VQGanVAE models: the VQGAN's .yaml")
    dp.add_argument("--openai_encoder_path", help="OpenAIDiscreteVAE models: OpenAI's encoder.pkl")
    dp.add_argument("--openai_decoder_path", help="OpenAIDiscreteVAE models: OpenAI's decoder.pkl")
    dp.add_argument("--vae_out", help="DiscreteVAE models: where its VAE file goes (default OUT.vae.pt beside OUT)")
    dp.add_argument("--trust_pickle", action="store_true",
                    help="read a file torch.load(weights_only=True) refuses (runs its pickled code: trust it)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    sources = Sources(args.bpe_path, args.hug, args.vqgan_model_path, args.vqgan_config_path,
                      args.openai_encoder_path, args.openai_decoder_path, args.trust_pickle)
    try:
        out = convert_file(args.input, args.output, sources, vae_out=args.vae_out)
    except ConversionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out} (a dalle_lab checkpoint of {args.input}); try: {generate_command()} --dalle_path {out} "
          "--text 'your caption'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
