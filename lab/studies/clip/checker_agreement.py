#!/usr/bin/env python
"""Does clip_score track the Shapes checker? Both scored on the same (image, caption) pairs.

    python -m lab.studies.clip.checker_agreement                                   # rendered images only
    python -m lab.studies.clip.checker_agreement --dalle_path runs/dalle/dalle.pt  # and images a DALLE sampled

Each image meets three captions: its own (right), its own with one attribute changed (a near miss: the checker
scores it partly right) and another image's (mostly wrong). For each set of images it reports, across all pairs:
the Spearman rank correlation of clip_score with the checker's attribute accuracy (shapes_faithfulness), the mean
clip_score per checker-accuracy level, and the pairwise agreement: for two captions of one image that the checker
scores differently, how often clip_score orders them the same way. On generated images it also reports the rank
correlation over the images with their own prompts (how well clip_score ranks samples by faithfulness, which is
what a reward must do). Images: rendered validation and held-out Shapes items, and (with --dalle_path) one sample
per validation caption. Writes a JSON results file with the raw values, command, commit, seeds and load average.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from lab.common import git_commit


def caption_sets(captions, seed: int):
    """(near-miss captions, the attribute each changed, other-image captions) for a list of captions."""
    from dalle_lab.data.shapes import describe, parse
    from dalle_lab.rewards.clip_data import attributes_of, variants

    rng = np.random.default_rng(seed)
    near, changed = [], []
    for caption in captions:
        spec = parse(caption)
        attribute = attributes_of(spec)[int(rng.integers(len(attributes_of(spec))))]
        options = variants(spec, attribute)
        near.append(describe(options[int(rng.integers(len(options)))]))
        changed.append(attribute)
    shift = 1 + int(rng.integers(len(captions) - 1))
    return near, changed, list(captions[shift:]) + list(captions[:shift])


def agreement(images, captions, reward, seed: int) -> dict:
    from dalle_lab.numerics import spearman
    from dalle_lab.rewards import shapes_faithfulness

    near, changed, other = caption_sets(captions, seed)
    kinds = {"right": list(captions), "near_miss": near, "other": other}
    clip, checker = {}, {}
    with torch.no_grad():
        for kind, texts in kinds.items():
            clip[kind] = reward(images, texts).double().numpy()
            checker[kind] = shapes_faithfulness(images, texts).double().numpy()
    all_clip = np.concatenate(list(clip.values()))
    all_checker = np.concatenate(list(checker.values()))
    levels = {}
    for level in np.unique(np.round(all_checker, 3)):
        chosen = np.isclose(all_checker, level, atol=1e-3)
        levels[f"{level:.3f}"] = {"n": int(chosen.sum()), "clip_score_mean": float(all_clip[chosen].mean())}
    agree, ties = [], 0
    names = list(kinds)
    for i in range(len(captions)):
        for a in range(3):
            for b in range(a + 1, 3):
                dc = checker[names[a]][i] - checker[names[b]][i]
                if abs(dc) < 1e-9:
                    ties += 1
                    continue
                agree.append(np.sign(clip[names[a]][i] - clip[names[b]][i]) == np.sign(dc))
    # per changed attribute: how often the image's own caption outscores its near miss (clip_score; the checker)
    by_attribute = {}
    for attribute in sorted(set(changed)):
        rows = [i for i, a in enumerate(changed) if a == attribute]
        by_attribute[attribute] = {
            "n": len(rows),
            "clip_right_above_near_miss": float(np.mean([clip["right"][i] > clip["near_miss"][i] for i in rows])),
            "checker_right_above_near_miss": float(np.mean([checker["right"][i] > checker["near_miss"][i]
                                                            for i in rows])),
            "clip_score_drop_mean": float(np.mean([clip["right"][i] - clip["near_miss"][i] for i in rows]))}
    result = {
        "n_images": len(captions),
        "near_miss_by_attribute": by_attribute,
        "spearman_all_pairs": spearman(all_clip, all_checker),
        "pearson_all_pairs": float(np.corrcoef(all_clip, all_checker)[0, 1]),
        "pairwise_agreement": float(np.mean(agree)) if agree else None, "pairs_compared": len(agree),
        "pairs_tied_by_checker": ties,
        "by_checker_accuracy": levels,
        "means": {kind: {"clip_score": float(clip[kind].mean()), "checker": float(checker[kind].mean())}
                  for kind in kinds},
        "raw": {kind: {"captions": kinds[kind], "clip_score": clip[kind].round(5).tolist(),
                       "checker": checker[kind].round(5).tolist()} for kind in kinds},
        "near_miss_changed": changed,
    }
    if np.ptp(checker["right"]) > 0:  # generated images: do the two agree which samples are faithful?
        result["spearman_own_prompt"] = spearman(clip["right"], checker["right"])
    return result


def generated_images(dalle_path, captions, seed: int, batch_size: int = 16):
    from dalle_lab.training.checkpoint import load_dalle
    from dalle_lab.generate import GenerationConfig

    dalle, tokenizer, _ = load_dalle(dalle_path)
    settings = GenerationConfig()
    generator = torch.Generator().manual_seed(seed)
    images = []
    with torch.no_grad():
        for start in range(0, len(captions), batch_size):
            text = tokenizer.tokenize(captions[start:start + batch_size], dalle.config.text_seq_len)
            images.append(dalle.generate_images(text, top_k=settings.top_k, top_p=settings.top_p,
                                                temperature=settings.temperature, cond_scale=settings.cond_scale,
                                                generator=generator).float().clamp(0, 1))
            print(f"sampled {start + len(text)}/{len(captions)}", file=sys.stderr)
    return torch.cat(images), {"top_k": settings.top_k, "top_p": settings.top_p,
                               "temperature": settings.temperature, "cond_scale": settings.cond_scale}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clip_path", default=None, help="dalle_lab CLIP directory (default: the shipped one)")
    parser.add_argument("--dalle_path", default=None, help="also score images this DALLE checkpoint samples")
    parser.add_argument("--n", type=int, default=96, help="images per set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="lab/studies/clip/results/checker_agreement.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from dalle_lab.data.shapes import ShapesDataset
    from dalle_lab.rewards import get_reward
    from dalle_lab.utils import atomic_write, file_sha256

    reward = get_reward("clip_score", clip_score_path=args.clip_path)
    load_before, start = os.getloadavg(), time.time()
    results = {"command": "python -m lab.studies.clip.checker_agreement " + " ".join(argv if argv is not None else sys.argv[1:]),
               "clip_path": str(reward.scorer.path), "seed": args.seed, "sets": {}}
    for split in ("val", "heldout"):
        images, captions = ShapesDataset(split, args.n, seed=args.seed).batch(range(args.n))
        results["sets"][f"rendered_{split}"] = agreement(images, captions, reward, args.seed)
        print(f"rendered {split}: Spearman {results['sets'][f'rendered_{split}']['spearman_all_pairs']:.3f}",
              file=sys.stderr)
    if args.dalle_path:
        _, captions = ShapesDataset("val", args.n, seed=args.seed).batch(range(args.n))
        images, sampling = generated_images(args.dalle_path, captions, args.seed)
        results["sets"]["generated_val"] = agreement(images, captions, reward, args.seed)
        results["dalle"] = {"path": str(args.dalle_path), "sha256": file_sha256(args.dalle_path), "sampling": sampling}
    results.update({"seconds": round(time.time() - start, 1), "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg(), "threads": args.threads, "torch": torch.__version__,
                    "git_commit": git_commit()})
    atomic_write(args.out, lambda tmp: Path(tmp).write_text(json.dumps(results, indent=1) + "\n"))
    for name, result in results["sets"].items():
        own = f", own-prompt Spearman {result['spearman_own_prompt']:.3f}" if "spearman_own_prompt" in result else ""
        print(f"{name}: Spearman {result['spearman_all_pairs']:.3f}, pairwise agreement "
              f"{result['pairwise_agreement']:.3f} ({result['pairs_compared']} pairs){own}; means "
              + ", ".join(f"{k} clip {v['clip_score']:.3f} / checker {v['checker']:.3f}" for k, v in result["means"].items()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
