"""Generate images from captions with a trained DALLE checkpoint.
Installed as the console script `dalle-generate`; `python generate.py` in a checkout runs the same.

    python generate.py --dalle_path runs/dalle/dalle.pt --text "a red circle|a blue square above a green triangle"

Writes <outputs_dir>/<caption_with_underscores>/<i>.png, a grid.png per caption, and one line per image in
<outputs_dir>/manifest.jsonl; a caption folder an earlier run wrote into is refused unless --overwrite replaces it.
The text and image tokenizers are found from what the checkpoint recorded (or where --bpe_path /
--vqgan_model_path + --vqgan_config_path say they are now). DALLE-pytorch's generate.py command lines
work too (--top_k 0.9, --gentxt, --hug, ...: docs/training.md), and so do its checkpoints: --dalle_path may name a
DALLE-pytorch train_dalle.py file, converted in memory (--bpe_path then names its vocabulary; docs/migrating.md).
"""
import argparse
import sys
from pathlib import Path

from dalle_lab.flags import OUTPUT_DIR, OVERWRITE, BooleanFlag, HelpFormatter, names
from dalle_lab.generate import STRATEGIES, GenerationConfig
from dalle_lab.training.dallepytorch_flags import FlagError, add_generate_flags, apply_generate_flags, parse_top_k

DEFAULTS = GenerationConfig()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--dalle_path", required=True, help="checkpoint written by train_dalle.py (e.g. runs/dalle/dalle.pt), "
                   "or by DALLE-pytorch's (converted in memory)")
    p.add_argument("--text", required=True, help='caption(s), several separated by "|"')
    p.add_argument("--num_images", type=int, default=8, help="images per caption")
    p.add_argument("--batch_size", type=int, default=16, help="images sampled at once")
    p.add_argument("--top_k", type=parse_top_k, default=str(DEFAULTS.top_k),
                   help="sample from the k likeliest image tokens (0: no top-k); a fraction in (0, 1) is "
                        "DALLE-pytorch's filter threshold: 0.9 keeps the likeliest 10%%")
    p.add_argument("--top_p", type=float, default=DEFAULTS.top_p, help="nucleus sampling threshold (none: off)")
    p.add_argument("--temperature", type=float, default=DEFAULTS.temperature, help="sampling temperature")
    p.add_argument("--cond_scale", type=float, default=None,
                   help=f"classifier-free guidance scale, 1 = off (default: {DEFAULTS.cond_scale:g}, or 1 for a model "
                        "trained without dropped captions, null_cond_prob 0, as every model converted from "
                        "DALLE-pytorch)")
    p.add_argument("--seed", type=int, default=0, help="random seed: the same seed gives the same images")
    p.add_argument(*names(OUTPUT_DIR, first="--outputs_dir"), dest="outputs_dir", default="outputs",
                   help="where images go: <outputs_dir>/<caption>/<i>.png, grid.png, and manifest.jsonl")
    p.add_argument(OVERWRITE[0], action="store_true",
                   help="a caption whose folder already holds images (from an earlier run) is refused, so the "
                        "manifest never lists images that were replaced; --overwrite deletes that folder's images "
                        "and their manifest lines first")
    p.add_argument("--progress", action=BooleanFlag, default=True,
                   help="a progress bar over the captions (shown only on a terminal)")
    p.add_argument("--device", default="auto", help="auto|cpu|cuda")
    p.add_argument("--truncate_captions", action="store_true",
                   help="cut captions longer than the model's text_seq_len instead of failing")
    p.add_argument("--strategy", choices=STRATEGIES, default=DEFAULTS.strategy,
                   help="how the decode passes run, the same images for a seed whichever runs (speculative: the same "
                        "distribution, other images): auto picks the fastest exact one; compiled costs a compile at "
                        "the first batch (docs/model.md, 'Generation'; docs/performance.md)")
    p.add_argument("--attention_maps", action="store_true",
                   help="also save attention maps: where each image cell looked in the caption "
                        "(<outputs_dir>/<caption>/attention/)")
    p.add_argument("--bpe_path", default=None,
                   help="the checkpoint's text vocabulary where it is now (it must be the same file: hash checked); "
                        "none: where the checkpoint recorded it")
    p.add_argument("--vqgan_model_path", default=None,
                   help="the checkpoint's VQGAN .ckpt where it is now (same file); none: where it was recorded")
    p.add_argument("--vqgan_config_path", default=None, help="the checkpoint's VQGAN .yaml where it is now")
    p.add_argument("--openai_encoder_path", default=None, help="DALLE-pytorch files with OpenAI's VAE: its encoder.pkl")
    p.add_argument("--openai_decoder_path", default=None, help="DALLE-pytorch files with OpenAI's VAE: its decoder.pkl")
    p.add_argument("--gentxt", action="store_true",
                   help="continue each caption with the model's text head first (printed), then draw the images "
                        "for the completed caption")
    add_generate_flags(p)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    entries = [c.strip() for c in args.text.split("|")]
    captions = [c for c in entries if c]
    if not captions:
        print("generate.py: error: --text holds no caption", file=sys.stderr)
        return 2
    if len(captions) < len(entries):  # "a|" or "a||b": an empty entry is not an (unconditional) caption here
        print(f"generate.py: note: {len(entries) - len(captions)} empty caption(s) in --text left out",
              file=sys.stderr)
    if args.num_images < 1 or args.batch_size < 1:
        print("generate.py: error: --num_images and --batch_size must be at least 1", file=sys.stderr)
        return 2
    try:
        for note in apply_generate_flags(args):
            print(f"generate.py: note: {note}", file=sys.stderr)
    except FlagError as err:
        print(f"generate.py: error: {err}", file=sys.stderr)
        return 2

    import torch

    from dalle_lab.convert import ConversionError, load_dalle
    from dalle_lab.generate.folders import complete_captions, generate_to_folder
    from dalle_lab.generate.sampling import resolve_top_k
    from dalle_lab.training.captions import warn_unknown_words
    from dalle_lab.training.checkpoint import CheckpointError
    from dalle_lab.utils import pick_device

    top_k, filter_thres = args.top_k
    try:
        device = pick_device(args.device)
        vqgan = (args.vqgan_model_path, args.vqgan_config_path) if args.vqgan_model_path else None
        openai = (args.openai_encoder_path, args.openai_decoder_path) if args.openai_encoder_path else None
        dalle, tokenizer, vae = load_dalle(args.dalle_path, device, bpe_path=args.bpe_path, vqgan_paths=vqgan,
                                           hug=args.hug, openai_paths=openai)
        if filter_thres is not None:  # DALLE-pytorch's threshold, counted over the image vocabulary
            top_k = resolve_top_k(None, filter_thres, dalle.config.num_image_tokens)
        config = GenerationConfig(top_k=top_k, top_p=args.top_p, temperature=args.temperature,
                                  cond_scale=_cond_scale(args.cond_scale, dalle.config), strategy=args.strategy)
        warn_unknown_words(tokenizer, captions, "generate.py")  # named, then generated all the same
        if args.gentxt:
            completed = complete_captions(dalle, tokenizer, captions, config, args.seed, args.truncate_captions,
                                          filter_thres=filter_thres)
            for given, caption in zip(captions, completed):
                print(f"completed caption: {given!r} -> {caption!r}")
            captions = completed
            args.truncate_captions = True  # re-tokenized as typed: a BPE may spell the decoded text a token longer
        with torch.inference_mode():
            records = generate_to_folder(dalle, vae, tokenizer, captions, args.outputs_dir, args.num_images,
                                         args.batch_size, config, args.seed, checkpoint=str(args.dalle_path),
                                         truncate=args.truncate_captions, overwrite=args.overwrite,
                                         progress=args.progress and sys.stderr.isatty())
            if args.attention_maps:
                _attention_maps(dalle, tokenizer, vae, captions, config, args)
    except (CheckpointError, ConversionError, ValueError, FileNotFoundError) as err:
        print(f"generate.py: error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {len(records)} images for {len(captions)} caption(s) to {args.outputs_dir}/ "
          f"(manifest: {args.outputs_dir}/manifest.jsonl)")
    return 0


def _cond_scale(given: float | None, config) -> float:
    """--cond_scale, or its default: guidance moves away from the caption-free prediction, which a model trained
    without dropped captions (null_cond_prob 0: DALLE-pytorch's train_dalle.py never dropped them) never learned."""
    if given is not None:
        return given
    if config.null_cond_prob > 0:
        return DEFAULTS.cond_scale
    print("note: this model was trained without dropped captions (null_cond_prob 0), so classifier-free guidance "
          "is off (cond_scale 1); pass --cond_scale to use it anyway", file=sys.stderr)
    return 1.0


def _attention_maps(dalle, tokenizer, vae, captions, config, args) -> None:
    """For each caption, sample one more image (seeded) and draw where its image cells looked in the caption:
    <outputs_dir>/<caption>/attention/*.png (the decoded image is drawn beside the heatmaps)."""
    import torch

    from dalle_lab.generate import generate
    from dalle_lab.generate.folders import caption_dirname
    from dalle_lab.viz.attention import save_attention_maps

    for c, caption in enumerate(captions):
        text = tokenizer.tokenize([caption], dalle.config.text_seq_len, truncate_text=args.truncate_captions)
        text = text.to(next(dalle.parameters()).device)
        generator = torch.Generator(device=text.device).manual_seed(args.seed + c)
        tokens, _ = generate(dalle, text, config, generator=generator)
        labels = [tokenizer.decode([i]) for i in text[0].tolist() if i != 0]
        paths = save_attention_maps(dalle, text, tokens, labels,
                                    Path(args.outputs_dir) / caption_dirname(caption) / "attention")
        print(f"attention maps for {caption!r}: {paths[0].parent}")


if __name__ == "__main__":  # python -m dalle_lab.cli.generate (torchrun -m, deepspeed --module)
    from dalle_lab.cli import run

    sys.exit(run(main))
