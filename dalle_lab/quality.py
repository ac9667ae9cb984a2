"""Quality of a trained Shapes DALLE: generate for captions it never saw and score the images with the Shapes checker.

    python -m dalle_lab.quality --dalle_path runs/dalle/dalle.pt

Prints, for 200 validation captions (unseen captions of seen colour-shape pairs) and 100 held-out-composition
captions (colour-shape pairs never seen in training): attribute accuracy, exact match, per-attribute accuracy, and
the chance level (the same images scored against shuffled captions), and whether the main job's targets are met
(validation: attribute accuracy >= 0.90, exact match >= 0.60; held-out compositions: >= 0.80, >= 0.30). It also
prints the image tokenizer's ceiling (the checker on VQGAN reconstructions of the real validation images). Add
--json FILE to keep the numbers.
"""
import argparse
import json
import random
import sys
import time

from dalle_lab.flags import HelpFormatter
from dalle_lab.provenance import git_state, machine

# the main job's quality targets on unseen captions (split, metric, at least)
TARGETS = (("validation", "accuracy", 0.90), ("validation", "exact_match", 0.60),
           ("heldout", "accuracy", 0.80), ("heldout", "exact_match", 0.30))


def build_parser() -> argparse.ArgumentParser:
    # sampling defaults: the library's (GenerationConfig), so the benchmark scores what generate.py produces
    from dalle_lab.generate import GenerationConfig

    defaults = GenerationConfig()
    p = argparse.ArgumentParser(prog="python -m dalle_lab.quality", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--dalle_path", default="runs/dalle/dalle.pt", help="the Shapes checkpoint to score")
    p.add_argument("--n_val", type=int, default=200, help="validation captions (unseen captions of seen pairs)")
    p.add_argument("--n_heldout", type=int, default=100, help="held-out-composition captions (pairs never seen)")
    p.add_argument("--top_k", type=int, default=defaults.top_k, help="sampling top-k (0: off)")
    p.add_argument("--top_p", type=float, default=defaults.top_p, help="nucleus sampling threshold (none: off)")
    p.add_argument("--temperature", type=float, default=defaults.temperature, help="sampling temperature")
    p.add_argument("--cond_scale", type=float, default=defaults.cond_scale,
                   help="classifier-free guidance scale, 1 = off (the default is calibrated in lab/studies/recipe/)")
    p.add_argument("--batch_size", type=int, default=50, help="images sampled at once")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (the same seed gives the same images)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (none: torch's choice)")
    p.add_argument("--json", default=None, help="also write the numbers to this file (none: print only)")
    p.add_argument("--no_ceiling", action="store_true",
                   help="skip the image tokenizer's ceiling (the checker on VQGAN reconstructions of the real "
                        "validation images: no DALLE can score above what its tokenizer can draw)")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)

    import torch

    from dalle_lab.data.checker import evaluate
    from dalle_lab.data.shapes import heldout_captions, validation_captions
    from dalle_lab.training.checkpoint import CheckpointError, load_dalle
    from dalle_lab.generate import GenerationConfig
    from dalle_lab.generate.folders import sample_images

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        dalle, tokenizer, vae = load_dalle(args.dalle_path, "cpu")
    except (CheckpointError, FileNotFoundError) as err:  # a missing or foreign checkpoint: one line
        print(f"python -m dalle_lab.quality: error: {err}", file=sys.stderr)
        return 1
    from dalle_lab.tokenizers import is_shipped_vocabulary

    if not is_shipped_vocabulary(tokenizer, "shapes"):  # its captions and checker are the Shapes grammar's
        print(f"python -m dalle_lab.quality: error: {args.dalle_path} is not a model of the built-in Shapes data (its "
              f"vocabulary is {tokenizer.path}): this command scores Shapes captions with the Shapes checker; for "
              "your own data, generate with generate.py and judge the images, or fine-tune and evaluate with "
              "python -m dalle_lab.align --prompts/--eval_prompts", file=sys.stderr)
        return 1
    settings = GenerationConfig(top_k=args.top_k or None, top_p=args.top_p, temperature=args.temperature,
                                cond_scale=args.cond_scale)
    ckpt_step = torch.load(args.dalle_path, weights_only=True, map_location="cpu").get("step")
    report = {"checkpoint": args.dalle_path, "step": ckpt_step, "settings": vars(args)}
    for name, captions in (("validation", validation_captions(args.n_val)),
                           ("heldout", heldout_captions(args.n_heldout))):
        if not captions:
            continue
        start = time.perf_counter()
        images = sample_images(dalle, vae, tokenizer, captions, settings, seed=args.seed, batch_size=args.batch_size)
        seconds = time.perf_counter() - start
        scores = evaluate(images, captions)
        shuffled = list(captions)
        random.Random(args.seed).shuffle(shuffled)
        chance = evaluate(images, shuffled)
        report[name] = {"n": len(captions), "accuracy": scores["accuracy"], "exact_match": scores["exact_match"],
                        "per_attribute": scores["per_attribute"], "chance_accuracy": chance["accuracy"],
                        "generation_seconds": seconds}
        print(f"{name:10s} n={len(captions):4d}  attribute accuracy {scores['accuracy']:.3f}  exact match "
              f"{scores['exact_match']:.3f}  (shuffled-caption chance {chance['accuracy']:.3f}; "
              f"generated in {seconds:.0f} s)")
        for attribute, value in sorted(scores["per_attribute"].items()):
            print(f"    {attribute:24s} {value:.3f}")
    if not args.no_ceiling and args.n_val:
        from dalle_lab.data.shapes import ShapesDataset

        real, captions = ShapesDataset("val", length=args.n_val).batch(range(args.n_val))
        with torch.no_grad():
            reconstructions = torch.cat([vae.decode(vae.get_codebook_indices(real[i:i + args.batch_size]))
                                         for i in range(0, len(real), args.batch_size)])
        ceiling = evaluate(reconstructions, captions)
        report["tokenizer_ceiling"] = {"accuracy": ceiling["accuracy"], "exact_match": ceiling["exact_match"]}
        print(f"tokenizer ceiling (checker on VQGAN reconstructions of the real validation images): attribute "
              f"accuracy {ceiling['accuracy']:.3f}  exact match {ceiling['exact_match']:.3f}")
    if args.json:
        report.update(git=git_state(), machine=machine())  # which code, on which CPU kind, under what load
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    for split, metric, goal in TARGETS:
        if split in report:
            value = report[split][metric]
            print(f"target {split} {metric.replace('_', ' ')} >= {goal:.2f}: {'met' if value >= goal else 'NOT met'} "
                  f"({value:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
