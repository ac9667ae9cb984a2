"""`python -m dalle_lab.precision.parity` (dalle-parity): how the LAION aesthetic scorer's embeddings and scores move
in bf16, fp16 and emulated TPU-default precision, on your images, a DALLE checkpoint's samples or CLIP embeddings.

Examples:
    # aesthetic scorer with a local CLIP ViT-L/14 on a folder of images, head-only check on the real embeddings
    python -m dalle_lab.precision.parity --clip_path ~/models/clip-vit-large-patch14 \\
        --head_path sac+logos+ava1-l14-linearMSE.pth --images my_images/ --embeddings vit_l_14_embeddings/ --out parity/
    # no CLIP weights: a random-weight ViT-L/14 (said plainly in every output), images sampled by a DALLE checkpoint
    python -m dalle_lab.precision.parity --head_path ...pth --dalle_path dalle.pt --prompts prompts.txt --out parity/
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from dalle_lab.flags import OUTPUT_DIR, HelpFormatter
from dalle_lab.generate import GenerationConfig
from dalle_lab.numerics import PRECISION_MODES
from dalle_lab.precision.aesthetic_parity import encoder_parity, head_parity, markdown_report, write_report
from dalle_lab.precision.inputs import generate_dalle_images, load_embedding_folder, load_image_folder
from dalle_lab.provenance import git_state, machine
from dalle_lab.rewards.aesthetic import AestheticHead, AestheticScorer, random_clip_vision, vit_l14_vision_config
from dalle_lab.utils import pick_device

# how --dalle_path samples: plain draws from the model's distribution (DALLE-pytorch's generate_images defaults)
PLAIN_SAMPLING = GenerationConfig(top_k=None, temperature=1.0, cond_scale=1.0)
RANDOM_CLIP_NOTE = ("CLIP WEIGHTS ARE RANDOM: no --clip_path was given, so the encoder is a ViT-L/14-architecture CLIP "
                    "with random weights (seed {seed}{details}). It shows how the architecture carries rounding error, "
                    "not what the real scorer does; random weights understate the real drift (trained weights have "
                    "larger, structured activations).")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dalle_lab.precision.parity", description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--head_path", required=True, help="LAION aesthetic head .pth (sac+logos+ava1-l14-linearMSE)")
    parser.add_argument("--clip_path", help="local CLIP: transformers directory or OpenAI state-dict file; "
                                            "none: a random-weight ViT-L/14 (stated in the outputs)")
    parser.add_argument("--images", help="folder of images to score (none: no image check)")
    parser.add_argument("--dalle_path", help="DALLE checkpoint to sample images from (with --prompts)")
    parser.add_argument("--prompts", help="text file, one prompt per line (with --dalle_path)")
    parser.add_argument("--embeddings", help="folder of .npy CLIP embeddings for the head-only check (none: no "
                                             "head-only check)")
    parser.add_argument("--modes", nargs="+", default=["bf16", "fp16", "tpu_default"],
                        choices=[m for m in PRECISION_MODES if m != "fp32"], help="modes compared with fp32")
    parser.add_argument("--max_images", type=int, default=8, help="score at most this many images")
    parser.add_argument("--batch_size", type=int, default=4, help="images scored at once")
    parser.add_argument("--random_clip_layers", type=int, default=None,
                        help="with no --clip_path: fewer layers than ViT-L/14's 24, for a quick look")
    parser.add_argument("--random_clip_init_factor", type=float, default=1.0,
                        help="with no --clip_path: scale of the random weights (transformers' initializer_factor); "
                             "larger gives sharper attention and larger activations, and more rounding drift")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random CLIP and of DALLE sampling")
    parser.add_argument("--device", default="cpu", help="auto|cpu|cuda")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (none: torch's choice)")
    parser.add_argument(*OUTPUT_DIR, dest="out", default="parity_report",
                        help="the report's folder: parity.json, parity.md, parity.png")
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    if not (args.images or args.dalle_path or args.embeddings):
        sys.exit("nothing to compare: give --images FOLDER, --dalle_path CKPT --prompts FILE, or --embeddings FOLDER")
    if args.dalle_path and not args.prompts:
        sys.exit("--dalle_path needs --prompts FILE (one prompt per line)")
    if args.max_images < 1:
        sys.exit(f"python -m dalle_lab.precision.parity: error: --max_images must be at least 1, got {args.max_images}")
    try:
        return run(args)
    except (FileNotFoundError, ValueError) as error:  # a missing file, a wrong checkpoint: the message says which
        sys.exit(f"python -m dalle_lab.precision.parity: error: {error}")


def run(args) -> dict:
    """The report the flags ask for, written to --out and printed."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    head = AestheticHead.from_file(args.head_path)
    report = {"modes_compared": args.modes, "device": str(device), "head_path": str(args.head_path), "notes": [],
              "git": git_state(), "machine": machine()}
    start = time.time()
    details = ""

    if args.embeddings:
        embeddings, names = load_embedding_folder(args.embeddings)
        width = head.layers[0].in_features
        if embeddings.shape[-1] != width:  # another CLIP's embeddings (ViT-B/32 gives 512)
            raise ValueError(f"the embeddings in {args.embeddings} are {embeddings.shape[-1]}-dimensional but the head "
                             f"{args.head_path} expects {width} (CLIP ViT-L/14's): give that CLIP's embeddings")
        report["head_only"] = head_parity(head.to(device), embeddings, args.modes, names)
        report["embeddings_path"] = str(args.embeddings)

    if args.images or args.dalle_path:
        if args.clip_path:
            clip, clip_note = args.clip_path, f"CLIP from {args.clip_path}"
        else:
            overrides = {"initializer_factor": args.random_clip_init_factor}
            details = "" if args.random_clip_init_factor == 1.0 else f", init factor {args.random_clip_init_factor:g}"
            if args.random_clip_layers:
                overrides["num_hidden_layers"] = args.random_clip_layers
                details += f", {args.random_clip_layers} of its 24 layers"
            clip = random_clip_vision(vit_l14_vision_config(**overrides), seed=args.seed)
            clip_note = RANDOM_CLIP_NOTE.format(seed=args.seed, details=details)
            report["notes"].append(clip_note)
            print(clip_note, file=sys.stderr)
        scorer = AestheticScorer(clip, head=head, device=device)
        report["clip"] = clip_note
        if args.images:
            images, names = load_image_folder(args.images, args.max_images)
            report["images_source"] = f"folder {args.images}"
        else:
            with open(args.prompts) as handle:
                prompts = [line.strip() for line in handle if line.strip()][:args.max_images]
            images, names = generate_dalle_images(args.dalle_path, prompts, PLAIN_SAMPLING, device, args.seed)
            report["images_source"] = f"sampled by {args.dalle_path} (seed {args.seed})"
        report["encoder"] = encoder_parity(scorer, images, args.modes, names, args.batch_size,
                                           progress=lambda line: print(line, file=sys.stderr))
    report["seconds"] = round(time.time() - start, 1)
    if report["notes"]:
        report["title"] = f"random-weight ViT-L/14 CLIP (seed {args.seed}{details}) + real LAION head"
    else:
        report["title"] = report.get("clip", "LAION head on given embeddings")
    paths = write_report(report, args.out)
    print(markdown_report(report))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return report


if __name__ == "__main__":
    main()
