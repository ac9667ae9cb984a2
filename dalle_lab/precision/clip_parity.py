"""Parity report for the project's trained CLIP and its clip_score reward: what bf16, fp16 and tpu_default do to a
CLIP whose weights mean something (parity.py does the same for the aesthetic scorer).

Per mode against float32, on (image, caption) pairs: the image and caption embedding cosines, the per-layer mean
token cosine of the image tower's hidden states, clip_score changes with both towers in the mode (what a reward run in
that precision computes) and with only the image tower in it (the caption embeddings are computed once per prompt and
could be kept in float32), the Spearman rank correlation of the scores, and whether retrieval (each caption's best
image among all) still picks the same images.

    python -m dalle_lab.precision.clip_parity --out reports/parity/trained_clip            # rendered Shapes images
    python -m dalle_lab.precision.clip_parity --dalle_path runs/dalle/dalle.pt --out ...    # and DALLE samples
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

from dalle_lab.precision.modes import check_mode
from dalle_lab.precision.parity import DEFAULT_MODES, _cosine, _fmt, _json_safe, _token_cosine
from dalle_lab.precision.reward_gap import spearman


@torch.no_grad()
def clip_parity(scorer, images, captions, modes=DEFAULT_MODES, batch_size: int = 64) -> dict:
    """Compare a ClipScorer in each mode with float32 on images (B,3,H,W) in [0,1] and their captions."""
    from dalle_lab.rewards.clip import clipscore

    modes = [check_mode(mode) for mode in modes if mode != "fp32"]

    def run(mode):
        outs = [scorer.encode_images(images[i:i + batch_size], mode, output_hidden_states=True)
                for i in range(0, len(images), batch_size)]
        hidden = [torch.cat([out.hidden_states[k].float() for out, _ in outs]) for k in range(len(outs[0][0].hidden_states))]
        return hidden, torch.cat([embeds for _, embeds in outs]), scorer.encode_text(list(captions), mode)

    def retrieval(image, text):
        picks = (text @ image.T).argmax(1)
        return picks, float(np.mean([captions[j] == captions[i] for i, j in enumerate(picks.tolist())]))

    ref_hidden, ref_image, ref_text = run("fp32")
    ref_scores = clipscore((ref_image * ref_text).sum(-1)).double().numpy()
    ref_picks, ref_top1 = retrieval(ref_image, ref_text)
    report = {"n": len(images), "fp32_scores": ref_scores.tolist(), "fp32_caption_to_image_top1": ref_top1,
              "modes": {}}
    embeds = {}
    for mode in modes:
        hidden, image, text = run(mode)
        embeds[mode] = image
        scores = clipscore((image * text).sum(-1)).double().numpy()
        image_only = clipscore((image * ref_text).sum(-1)).double().numpy()
        picks, top1 = retrieval(image, text)
        image_cos, text_cos = _cosine(image, ref_image), _cosine(text, ref_text)
        layers = np.stack([_token_cosine(low, ref) for low, ref in zip(hidden, ref_hidden)], axis=1)
        worst = int(np.argmin(image_cos))
        report["modes"][mode] = {
            "image_cosine_mean": float(image_cos.mean()), "image_cosine_min": float(image_cos.min()),
            "text_cosine_mean": float(text_cos.mean()), "text_cosine_min": float(text_cos.min()),
            "score_abs_diff_mean": float(np.abs(scores - ref_scores).mean()),
            "score_abs_diff_max": float(np.abs(scores - ref_scores).max()),
            "score_diff_mean": float((scores - ref_scores).mean()),
            "image_tower_only_score_abs_diff_mean": float(np.abs(image_only - ref_scores).mean()),
            "spearman": spearman(ref_scores, scores), "caption_to_image_top1": top1,
            "same_retrieval_as_fp32": float((picks == ref_picks).float().mean()),
            "worst_image": worst, "worst_image_cosine": float(image_cos[worst]),
            "products_rounded_last_batch": int(getattr(scorer.last_precision, "num_products", 0) or 0),
            "per_layer_cosine_mean": layers.mean(axis=0).tolist(), "per_layer_cosine_min": layers.min(axis=0).tolist(),
            "per_image": {"image_cosine": image_cos.tolist(), "score": scores.tolist()},
        }
    report["between_modes"] = {f"{a} vs {b}": float(_cosine(embeds[a], embeds[b]).mean())
                               for i, a in enumerate(modes) for b in modes[i + 1:]}
    return report


def markdown(report: dict) -> str:
    lines = [f"# Trained CLIP precision parity ({report.get('clip', 'CLIP')})", ""]
    for name, result in report["sets"].items():
        lines += [f"## {name}: {result['n']} images ({result.get('source', '')})", "",
                  f"float32: mean clip_score {np.mean(result['fp32_scores']):.4f}, caption-to-image top-1 "
                  f"{result['fp32_caption_to_image_top1']:.3f}", "",
                  "| mode | image cosine mean / min | caption cosine mean / min | mean / max abs clip_score diff | "
                  "image tower only | Spearman | top-1 | same retrieval |", "|---|---|---|---|---|---|---|---|"]
        for mode, m in result["modes"].items():
            lines.append(f"| {mode} | {_fmt(m['image_cosine_mean'], 6)} / {_fmt(m['image_cosine_min'], 6)} | "
                         f"{_fmt(m['text_cosine_mean'], 6)} / {_fmt(m['text_cosine_min'], 6)} | "
                         f"{_fmt(m['score_abs_diff_mean'], 5)} / {_fmt(m['score_abs_diff_max'], 5)} | "
                         f"{_fmt(m['image_tower_only_score_abs_diff_mean'], 5)} | {_fmt(m['spearman'], 4)} | "
                         f"{_fmt(m['caption_to_image_top1'], 3)} | {_fmt(m['same_retrieval_as_fp32'], 3)} |")
        layers = len(next(iter(result["modes"].values()))["per_layer_cosine_mean"])
        lines += ["", "Per-layer mean token cosine of the image tower's hidden states (layer 0 = embeddings):", "",
                  "| mode | " + " | ".join(f"layer {i}" for i in range(layers)) + " |", "|---|" + "---|" * layers]
        for mode, m in result["modes"].items():
            lines.append(f"| {mode} | " + " | ".join(_fmt(v, 6) for v in m["per_layer_cosine_mean"]) + " |")
        if result.get("between_modes"):
            lines += ["", "Image embeddings, low precisions against each other (cosine mean): " +
                      "; ".join(f"{pair} {_fmt(v, 6)}" for pair, v in result["between_modes"].items())]
        lines.append("")
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(report["sets"].items())
    figure, axes = plt.subplots(1, len(sets), figsize=(5 * len(sets), 4), squeeze=False)
    for axis, (name, result) in zip(axes[0], sets):
        for mode, m in result["modes"].items():
            drift = np.maximum(1.0 - np.asarray(m["per_layer_cosine_mean"]), 1e-12)
            axis.semilogy(range(len(drift)), drift, marker=".", label=mode)
        axis.set(xlabel="image-tower layer (0 = embeddings)", ylabel="1 - mean token cosine vs fp32", title=name)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110, format="png")
    plt.close(figure)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m dalle_lab.precision.clip_parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clip_path", default=None, help="dalle_lab CLIP directory (default: the shipped one)")
    parser.add_argument("--dalle_path", default=None, help="also compare on images this DALLE checkpoint samples")
    parser.add_argument("--n", type=int, default=128, help="images per set")
    parser.add_argument("--modes", nargs="+", default=list(DEFAULT_MODES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="clip_parity_report", help="folder: parity.json, parity.md, parity.png")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from dalle_lab.data.shapes import ShapesDataset
    from dalle_lab.rewards.clip import ClipScorer
    from dalle_lab.utils import atomic_write

    try:
        scorer = ClipScorer(args.clip_path)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"python -m dalle_lab.precision.clip_parity: error: {error}")
    start, load_before = time.time(), os.getloadavg()
    report = {"clip": str(scorer.path), "modes_compared": args.modes, "seed": args.seed, "sets": {},
              "command": "python -m dalle_lab.precision.clip_parity " + " ".join(argv if argv is not None else sys.argv[1:])}
    images, captions = ShapesDataset("val", args.n, seed=args.seed).batch(range(args.n))
    report["sets"]["rendered_val"] = {**clip_parity(scorer, images, captions, args.modes),
                                      "source": f"rendered Shapes validation items 0..{args.n - 1}, seed {args.seed}"}
    if args.dalle_path:
        from dalle_lab.precision.parity import generate_dalle_images
        from dalle_lab.utils import file_sha256

        images, _ = generate_dalle_images(args.dalle_path, captions, seed=args.seed, top_k=10, temperature=0.7)
        report["sets"]["generated_val"] = {**clip_parity(scorer, images, captions, args.modes),
                                           "source": f"sampled by {args.dalle_path} (sha256 "
                                                     f"{file_sha256(args.dalle_path)[:12]}, seed {args.seed}, top_k 10, "
                                                     "temperature 0.7) for the same captions"}
    report.update({"seconds": round(time.time() - start, 1), "loadavg_before": load_before,
                   "loadavg_after": os.getloadavg(), "torch": torch.__version__})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "parity.json", lambda tmp: Path(tmp).write_text(json.dumps(_json_safe(report), indent=1) + "\n"))
    atomic_write(out / "parity.md", lambda tmp: Path(tmp).write_text(markdown(report)))
    atomic_write(out / "parity.png", lambda tmp: plot(report, tmp))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
