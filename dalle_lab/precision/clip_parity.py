"""Parity report for the project's trained CLIP and its clip_score reward: what bf16, fp16 and tpu_default do to a
CLIP whose weights mean something (aesthetic_parity.py does the same for the aesthetic scorer).

Per mode against float32, on (image, caption) pairs: the image and caption embedding cosines, the per-layer mean
token cosine of the image tower's hidden states, clip_score changes with both towers in the mode (what a reward run in
that precision computes) and with only the image tower in it (the caption embeddings are computed once per prompt and
could be kept in float32), the Spearman rank correlation of the scores, and whether retrieval (each caption's best
image among all) still picks the same images.

    python -m dalle_lab.precision.clip_parity --out lab/studies/parity/results/trained_clip            # rendered Shapes images
    python -m dalle_lab.precision.clip_parity --dalle_path runs/dalle/dalle.pt --out ...    # and DALLE samples
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from dalle_lab.data.shapes import ShapesDataset
from dalle_lab.extras import needs_extra
from dalle_lab.generate import GenerationConfig
from dalle_lab.numerics import check_mode, spearman
from dalle_lab.precision.inputs import emoji_images, generate_dalle_images
from dalle_lab.precision.measures import DEFAULT_MODES, embedding_cosine, fmt, json_safe, token_cosine
from dalle_lab.provenance import git_state, load_average, machine
from dalle_lab.rewards.clip import ClipScorer, clipscore, load_clip, new_clip
from dalle_lab.utils import atomic_write, file_sha256


@torch.no_grad()
def activation_stats(model, pixels) -> dict:
    """Per layer of the image tower, in float32: the mean (over images, heads and query tokens) of the largest
    attention probability, and the RMS of the residual stream (layer 0 = embeddings). Finding 4 of docs/parity.md
    found the drift switches on once the first passes about 0.35-0.8 and grows with the second, so these say
    where a CLIP stands against the random-weight numbers there. Computed on an eager copy of the model (only
    eager attention returns its weights), so the model itself keeps its attention implementation."""
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    out = eager.vision_model(pixel_values=pixels.float(), output_attentions=True, output_hidden_states=True)
    return {"tokens": int(out.hidden_states[0].shape[1]),
            "max_attention_prob": [float(a.max(-1).values.mean()) for a in out.attentions],
            "residual_rms": [float(h.pow(2).mean().sqrt()) for h in out.hidden_states]}


@torch.no_grad()
def clip_parity(scorer, images, captions=None, modes=DEFAULT_MODES, batch_size: int = 64) -> dict:
    """Compare a ClipScorer in each mode with float32 on images (B,3,H,W) in [0,1] and their captions.

    captions=None compares the image tower only (images no caption of the CLIP's describes, e.g. emoji for the
    Shapes CLIP): embedding and per-layer cosines, no scores or retrieval."""
    modes = [check_mode(mode) for mode in modes if mode != "fp32"]

    def run(mode):
        outs = [scorer.encode_images(images[i:i + batch_size], mode, output_hidden_states=True)
                for i in range(0, len(images), batch_size)]
        hidden = [torch.cat([out.hidden_states[k].float() for out, _ in outs]) for k in range(len(outs[0][0].hidden_states))]
        text = scorer.encode_text(list(captions), mode) if captions is not None else None
        return hidden, torch.cat([embeds for _, embeds in outs]), text

    def retrieval(image, text):
        picks = (text @ image.T).argmax(1)
        return picks, float(np.mean([captions[j] == captions[i] for i, j in enumerate(picks.tolist())]))

    ref_hidden, ref_image, ref_text = run("fp32")
    report = {"n": len(images), "modes": {},
              "fp32_activations": activation_stats(scorer.model, scorer.preprocess(images))}
    if captions is not None:
        ref_scores = clipscore((ref_image * ref_text).sum(-1)).double().numpy()
        ref_picks, ref_top1 = retrieval(ref_image, ref_text)
        report.update({"fp32_scores": ref_scores.tolist(), "fp32_caption_to_image_top1": ref_top1})
    embeds = {}
    for mode in modes:
        hidden, image, text = run(mode)
        embeds[mode] = image
        image_cos = embedding_cosine(image, ref_image)
        layers = np.stack([token_cosine(low, ref) for low, ref in zip(hidden, ref_hidden)], axis=1)
        worst = int(np.argmin(image_cos))
        result = {
            "image_cosine_mean": float(image_cos.mean()), "image_cosine_min": float(image_cos.min()),
            "worst_image": worst, "worst_image_cosine": float(image_cos[worst]),
            "products_rounded_last_batch": int(getattr(scorer.last_precision, "num_products", 0) or 0),
            "per_layer_cosine_mean": layers.mean(axis=0).tolist(), "per_layer_cosine_min": layers.min(axis=0).tolist(),
            "per_image": {"image_cosine": image_cos.tolist()},
        }
        if captions is not None:
            scores = clipscore((image * text).sum(-1)).double().numpy()
            image_only = clipscore((image * ref_text).sum(-1)).double().numpy()
            picks, top1 = retrieval(image, text)
            text_cos = embedding_cosine(text, ref_text)
            result.update({
                "text_cosine_mean": float(text_cos.mean()), "text_cosine_min": float(text_cos.min()),
                "score_abs_diff_mean": float(np.abs(scores - ref_scores).mean()),
                "score_abs_diff_max": float(np.abs(scores - ref_scores).max()),
                "score_diff_mean": float((scores - ref_scores).mean()),
                "image_tower_only_score_abs_diff_mean": float(np.abs(image_only - ref_scores).mean()),
                "spearman": spearman(ref_scores, scores), "caption_to_image_top1": top1,
                "same_retrieval_as_fp32": float((picks == ref_picks).float().mean()),
            })
            result["per_image"]["score"] = scores.tolist()
        report["modes"][mode] = result
    report["between_modes"] = {f"{a} vs {b}": float(embedding_cosine(embeds[a], embeds[b]).mean())
                               for i, a in enumerate(modes) for b in modes[i + 1:]}
    return report


def _set_lines(name: str, result: dict) -> list[str]:
    """One set's tables: per-mode embedding (and, with captions, score) changes, then per-layer cosines."""
    scored = "fp32_scores" in result
    lines = [f"## {name}: {result['n']} images ({result.get('source', '')})", ""]
    if scored:
        lines += [f"float32: mean clip_score {np.mean(result['fp32_scores']):.4f}, caption-to-image top-1 "
                  f"{result['fp32_caption_to_image_top1']:.3f}", "",
                  "| mode | image cosine mean / min | caption cosine mean / min | mean / max abs clip_score diff | "
                  "image tower only | Spearman | top-1 | same retrieval |", "|---|---|---|---|---|---|---|---|"]
    else:
        lines += ["Image tower only (no caption of this CLIP describes these images).", "",
                  "| mode | image cosine mean / min |", "|---|---|"]
    for mode, m in result["modes"].items():
        row = f"| {mode} | {fmt(m['image_cosine_mean'], 6)} / {fmt(m['image_cosine_min'], 6)} |"
        if scored:
            row += (f" {fmt(m['text_cosine_mean'], 6)} / {fmt(m['text_cosine_min'], 6)} | "
                    f"{fmt(m['score_abs_diff_mean'], 5)} / {fmt(m['score_abs_diff_max'], 5)} | "
                    f"{fmt(m['image_tower_only_score_abs_diff_mean'], 5)} | {fmt(m['spearman'], 4)} | "
                    f"{fmt(m['caption_to_image_top1'], 3)} | {fmt(m['same_retrieval_as_fp32'], 3)} |")
        lines.append(row)
    layers = len(next(iter(result["modes"].values()))["per_layer_cosine_mean"])
    lines += ["", "Per-layer mean token cosine of the image tower's hidden states (layer 0 = embeddings):", "",
              "| mode | " + " | ".join(f"layer {i}" for i in range(layers)) + " |", "|---|" + "---|" * layers]
    for mode, m in result["modes"].items():
        lines.append(f"| {mode} | " + " | ".join(fmt(v, 6) for v in m["per_layer_cosine_mean"]) + " |")
    stats = result.get("fp32_activations")
    if stats:
        lines += ["", f"float32 activations per layer ({stats['tokens']} tokens, uniform attention "
                      f"{1 / stats['tokens']:.3f}): mean max attention prob "
                      + ", ".join(fmt(v, 3) for v in stats["max_attention_prob"]) + "; residual RMS "
                      + ", ".join(fmt(v, 2) for v in stats["residual_rms"])]
    if result.get("between_modes"):
        lines += ["", "Image embeddings, low precisions against each other (cosine mean): " +
                  "; ".join(f"{pair} {fmt(v, 6)}" for pair, v in result["between_modes"].items())]
    return lines + [""]


def comparison_lines(report: dict) -> list[str]:
    """Trained weights against random weights of the same architecture, set by set and mode by mode."""
    controls = report.get("random_controls") or {}
    if not controls:
        return []
    lines = ["## Trained against random weights of the same architecture", "",
             "Same images, same modes; the random image towers use transformers' initialisation scaled by "
             "`initializer_factor` (docs/parity.md findings 2-4). Their caption scores mean nothing (random text "
             "tower), so only the image side is compared.", "",
             "| set | weights | mode | image cosine mean / min | last-layer token cosine | "
             "max attention prob, last layer | residual RMS, last layer |", "|---|---|---|---|---|---|---|"]
    for name, result in report["sets"].items():
        rows = [("trained", result)] + [(label, control["sets"][name]) for label, control in controls.items()
                                        if name in control["sets"]]
        for label, res in rows:
            stats = res["fp32_activations"]
            for mode, m in res["modes"].items():
                lines.append(f"| {name} | {label} | {mode} | {fmt(m['image_cosine_mean'], 6)} / "
                             f"{fmt(m['image_cosine_min'], 6)} | {fmt(m['per_layer_cosine_mean'][-1], 6)} | "
                             f"{fmt(stats['max_attention_prob'][-1], 3)} | {fmt(stats['residual_rms'][-1], 2)} |")
    return lines + [""]


def markdown(report: dict) -> str:
    lines = [f"# Trained CLIP precision parity ({report.get('clip', 'CLIP')})", ""]
    if report.get("command"):
        lines += [f"Command: `{report['command']}` (git {(report.get('git') or {}).get('commit')}, "
                  f"{report.get('threads', 'n/a')} thread(s), load average before {report.get('loadavg_before')})", ""]
    for name, result in report["sets"].items():
        lines += _set_lines(name, result)
    return "\n".join(lines + comparison_lines(report))


def plot(report: dict, path) -> None:
    with needs_extra("align", "the CLIP parity report's figure"):
        import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(report["sets"].items())
    controls = list((report.get("random_controls") or {}).items())
    figure, axes = plt.subplots(1, len(sets), figsize=(5 * len(sets), 4), squeeze=False)
    styles = ["--", ":", "-."]
    for axis, (name, result) in zip(axes[0], sets):
        curves = [("trained", "-", result)] + [(label, styles[i % 3], c["sets"][name])
                                               for i, (label, c) in enumerate(controls) if name in c["sets"]]
        for label, style, res in curves:
            for colour, (mode, m) in enumerate(res["modes"].items()):
                drift = np.maximum(1.0 - np.asarray(m["per_layer_cosine_mean"]), 1e-12)
                axis.semilogy(range(len(drift)), drift, style, marker=".", color=f"C{colour}",
                              label=f"{mode} ({label})")
        axis.set(xlabel="image-tower layer (0 = embeddings)", ylabel="1 - mean token cosine vs fp32", title=name)
        axis.legend(fontsize=6)
    figure.tight_layout()
    figure.savefig(path, dpi=110, format="png")
    plt.close(figure)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dalle_lab.precision.clip_parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clip_path", default=None, help="dalle_lab CLIP directory (default: the shipped one)")
    parser.add_argument("--dalle_path", default=None, help="also compare on images this DALLE checkpoint samples")
    parser.add_argument("--cond_scale", type=float, default=1.0,
                        help="guidance of the DALLE samples (generate.py samples at 2; 1 keeps the first report's)")
    parser.add_argument("--n", type=int, default=128, help="images per set")
    parser.add_argument("--emoji", type=int, default=0,
                        help="also compare the image tower on this many Twemoji drawings (out of the Shapes CLIP's domain)")
    parser.add_argument("--random_control", type=float, nargs="*", default=[], metavar="INIT_FACTOR",
                        help="also run random-weight CLIPs of the same architecture at these initializer_factors")
    parser.add_argument("--modes", nargs="+", default=list(DEFAULT_MODES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="clip_parity_report", help="folder: parity.json, parity.md, parity.png")
    return parser


def comparison_sets(args, image_size: int) -> dict:
    """name -> (images, captions or None, where they come from): rendered Shapes validation items, with --dalle_path
    that checkpoint's samples for the same captions, with --emoji Twemoji drawings (image tower only)."""
    images, captions = ShapesDataset("val", args.n, seed=args.seed).batch(range(args.n))
    sets = {"rendered_val": (images, captions, f"rendered Shapes validation items 0..{args.n - 1}, seed {args.seed}")}
    if args.dalle_path:
        sampling = GenerationConfig(top_k=10, temperature=0.7, cond_scale=args.cond_scale)
        generated, _ = generate_dalle_images(args.dalle_path, captions, sampling, seed=args.seed)
        sets["generated_val"] = (generated, captions, f"sampled by {args.dalle_path} (sha256 "
                                                      f"{file_sha256(args.dalle_path)[:12]}, seed {args.seed}, top_k "
                                                      f"10, temperature 0.7, cond_scale {args.cond_scale:g}) for the "
                                                      "same captions")
    if args.emoji:
        drawn, names = emoji_images(args.emoji, image_size, args.seed)
        sets["emoji_drawn"] = (drawn, None, f"Twemoji drawings, {args.emoji} of all names by a seed-{args.seed} "
                                            f"permutation, e.g. {', '.join(names[:3])}; image tower only")
    return sets


def random_controls(args, sets: dict) -> dict:
    """The same comparison on random-weight CLIPs of the trained one's architecture, one per --random_control."""
    _, tokenizer, metadata = load_clip(args.clip_path)
    arch = metadata["architecture"]
    controls = {}
    for factor in args.random_control:
        control = ClipScorer(model=new_clip(arch, tokenizer.vocab_size, seed=args.seed, vision_init_factor=factor),
                             tokenizer=tokenizer, context_length=arch.context_length)
        controls[f"random, init factor {factor:g}"] = {
            "init_factor": factor, "weights_seed": args.seed,
            "sets": {name: clip_parity(control, set_images, set_captions, args.modes)
                     for name, (set_images, set_captions, _) in sets.items()}}
    return controls


def write_report(report: dict, out) -> None:
    """parity.json, parity.md and parity.png under `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "parity.json", lambda tmp: Path(tmp).write_text(json.dumps(json_safe(report), indent=1) + "\n"))
    atomic_write(out / "parity.md", lambda tmp: Path(tmp).write_text(markdown(report)))
    atomic_write(out / "parity.png", lambda tmp: plot(report, tmp))


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        scorer = ClipScorer(args.clip_path)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"python -m dalle_lab.precision.clip_parity: error: {error}")
    start, cpu_start, load_before = time.time(), time.process_time(), load_average()
    report = {"clip": str(scorer.path), "modes_compared": args.modes, "seed": args.seed, "sets": {},
              "command": "python -m dalle_lab.precision.clip_parity " + " ".join(argv if argv is not None else sys.argv[1:]),
              "args": vars(args), "git": git_state(), "machine": machine(), "threads": torch.get_num_threads(),
              "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    sets = comparison_sets(args, scorer.image_size)
    for name, (set_images, set_captions, source) in sets.items():
        report["sets"][name] = {**clip_parity(scorer, set_images, set_captions, args.modes), "source": source}
    if args.random_control:
        report["random_controls"] = random_controls(args, sets)
    report.update({"seconds": round(time.time() - start, 1), "cpu_seconds": round(time.process_time() - cpu_start, 1),
                   "loadavg_before": load_before, "loadavg_after": load_average(), "torch": torch.__version__})
    write_report(report, args.out)
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
