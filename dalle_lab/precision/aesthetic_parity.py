"""Parity report: how a reward model's embeddings and scores move in bf16, fp16 and emulated TPU-default precision.

For the LAION aesthetic scorer (CLIP image encoder + linear head) and a set of images it measures, per mode against
float32: the embedding cosine similarity per image and per transformer layer (mean per-token cosine of the hidden
states: where the error grows), the score difference, the Spearman rank correlation of the scores across images,
the worst image, and the linear-head bound |score change| <= |w| * sqrt(2 - 2 cos). On CLIP embeddings alone (the real
rating embeddings) it measures the head's own share. Results go to JSON, a short markdown table and a PNG plot.

Command line: `python -m dalle_lab.precision.parity --help` (dalle_lab/precision/parity.py); the images it reads
come from inputs.py.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from dalle_lab.extras import needs_extra
from dalle_lab.numerics import check_mode, precision_mode, spearman
from dalle_lab.precision.measures import DEFAULT_MODES, embedding_cosine, fmt, json_safe, token_cosine
from dalle_lab.utils import atomic_write


def head_norm(head) -> float | None:
    """|w| of the head's affine map, or None when the head is not affine."""
    try:
        weight, _ = head.linear_equivalent()
    except (AttributeError, TypeError):
        return None
    return float(weight.norm())


def score_bound(weight_norm: float, cosine) -> np.ndarray:
    """Largest score change an affine head w.e+b allows between unit embeddings with cosine `cosine`.

    |w.(e1 - e2)| <= |w| |e1 - e2| and |e1 - e2|^2 = 2 - 2 cos for unit vectors.
    """
    return weight_norm * np.sqrt(np.clip(2.0 - 2.0 * np.asarray(cosine, dtype=np.float64), 0.0, None))


def _batches(images, batch_size):
    """Consecutive batches of images; images of unequal sizes (a list of (3,H,W)) go one size-group at a time."""
    if torch.is_tensor(images):
        for start in range(0, len(images), batch_size):
            yield range(start, min(start + batch_size, len(images))), images[start:start + batch_size]
        return
    start = 0
    while start < len(images):
        end = start + 1
        while end < len(images) and end - start < batch_size and images[end].shape == images[start].shape:
            end += 1
        yield range(start, end), torch.stack(list(images[start:end]))
        start = end


def encoder_parity(scorer, images, modes=DEFAULT_MODES, names=None, batch_size: int = 4, progress=None) -> dict:
    """Compare the scorer in each mode with float32 on `images` ((B,3,H,W) tensor or list of (3,H,W) in [0,1]).

    `scorer` is an AestheticScorer (anything with `.encode(images, precision, output_hidden_states)` returning
    (encoder output with hidden_states, unit embeddings, scores) and a `.head`). Runs without gradients.
    """
    modes = [check_mode(mode) for mode in modes if mode != "fp32"]
    count = len(images)
    names = list(names) if names is not None else [f"image{i}" for i in range(count)]
    weight_norm = head_norm(scorer.head)
    fp32_scores = np.zeros(count)
    per_mode = {mode: {"cosine": np.zeros(count), "score": np.zeros(count), "encoder_score": np.zeros(count),
                       "layers": None, "products": 0} for mode in modes}
    pairs = [(a, b) for i, a in enumerate(modes) for b in modes[i + 1:]]
    pair_cosine = {pair: np.zeros(count) for pair in pairs}
    with torch.no_grad():
        for index, batch in _batches(images, batch_size):
            mode_embeds = {}
            reference, ref_embeds, ref_scores = scorer.encode(batch, "fp32", output_hidden_states=True)
            fp32_scores[list(index)] = ref_scores.double().cpu().numpy()
            for mode in modes:
                out, embeds, scores = scorer.encode(batch, mode, output_hidden_states=True)
                result = per_mode[mode]
                result["products"] = max(result["products"], scorer.last_precision.num_products)
                result["cosine"][list(index)] = embedding_cosine(embeds, ref_embeds)
                mode_embeds[mode] = embeds
                result["score"][list(index)] = scores.double().cpu().numpy()
                # the head in float32 on this mode's embedding: isolates what the encoder's error does to the score
                result["encoder_score"][list(index)] = scorer.score_embeddings(embeds, "fp32").double().cpu().numpy()
                layers = np.stack([token_cosine(low.float(), ref.float())
                                   for low, ref in zip(out.hidden_states, reference.hidden_states)], axis=1)
                result["layers"] = layers if result["layers"] is None else np.concatenate([result["layers"], layers])
                if progress:
                    drift = ", ".join(f"{1 - c:.2e}" for c in result["cosine"][list(index)])
                    progress(f"{mode}: images {index.start}-{index.stop - 1}: 1 - embedding cosine {drift}")
            for a, b in pairs:
                pair_cosine[(a, b)][list(index)] = embedding_cosine(mode_embeds[a], mode_embeds[b])
    report = {"images": names, "fp32_scores": fp32_scores.tolist(), "head_weight_norm": weight_norm, "modes": {}}
    for mode, result in per_mode.items():
        report["modes"][mode] = _summarise(names, fp32_scores, result, weight_norm)
    # do two low precisions agree with each other? (a bf16 cast against emulated TPU products: similar, not equal)
    report["between_modes"] = {}
    for a, b in pairs:
        cosine = pair_cosine[(a, b)]
        report["between_modes"][f"{a} vs {b}"] = {
            "cosine_mean": float(cosine.mean()), "cosine_min": float(cosine.min()),
            "spearman": spearman(per_mode[a]["score"], per_mode[b]["score"]),
            "score_abs_diff_mean": float(np.abs(per_mode[a]["score"] - per_mode[b]["score"]).mean())}
    return report


def _summarise(names, fp32_scores, result, weight_norm) -> dict:
    difference = result["score"] - fp32_scores
    encoder_difference = result["encoder_score"] - fp32_scores
    worst = int(np.argmax(np.abs(difference)))
    summary = {
        "cosine_mean": float(result["cosine"].mean()), "cosine_min": float(result["cosine"].min()),
        "score_diff_mean": float(difference.mean()), "score_abs_diff_mean": float(np.abs(difference).mean()),
        "score_abs_diff_max": float(np.abs(difference).max()),
        "worst_image": names[worst], "worst_score_fp32": float(fp32_scores[worst]),
        "worst_score_mode": float(result["score"][worst]), "worst_cosine": float(result["cosine"][worst]),
        "spearman": spearman(fp32_scores, result["score"]),
        "products_rounded_per_batch": int(result["products"]),
    }
    per_image = {"cosine": result["cosine"].tolist(), "score": result["score"].tolist(),
                 "score_diff": difference.tolist(), "encoder_score_diff": encoder_difference.tolist()}
    if weight_norm is not None:
        bound = score_bound(weight_norm, result["cosine"])
        per_image["bound"] = bound.tolist()
        # the bound covers the encoder's share exactly; the head's own rounding in the mode comes on top of it
        summary["bound_holds_encoder_share"] = int((np.abs(encoder_difference) <= bound + 1e-4).sum())
        summary["bound_holds_total"] = int((np.abs(difference) <= bound + 1e-4).sum())
        summary["bound_max"] = float(bound.max())
    layers = result["layers"]
    return {"summary": summary, "per_image": per_image,
            "per_layer": {"cosine_mean": layers.mean(axis=0).tolist(), "cosine_min": layers.min(axis=0).tolist()}}


def head_parity(head, embeddings, modes=DEFAULT_MODES, names=None) -> dict:
    """Head-only parity: score the given CLIP embeddings (N, D) with the head in each mode against float32."""
    modes = [check_mode(mode) for mode in modes if mode != "fp32"]
    embeddings = torch.as_tensor(embeddings).float()
    names = list(names) if names is not None else [f"embedding{i}" for i in range(len(embeddings))]
    weight = head.layers[0].weight
    with torch.no_grad():
        with precision_mode(head, "fp32"):
            reference = head(embeddings.to(weight.device)).double().cpu().numpy()
        report = {"embeddings": names, "fp32_scores": reference.tolist(), "modes": {}}
        for mode in modes:
            with precision_mode(head, mode):
                scores = head(embeddings.to(weight.device, weight.dtype)).double().cpu().numpy()
            difference = scores - reference
            report["modes"][mode] = {
                "scores": scores.tolist(), "score_diff": difference.tolist(),
                "score_abs_diff_max": float(np.abs(difference).max()),
                "score_abs_diff_mean": float(np.abs(difference).mean()),
                "spearman": spearman(reference, scores),
                "monotone": bool(np.all(np.diff(scores) > 0)),
            }
    report["fp32_monotone"] = bool(np.all(np.diff(reference) > 0))
    return report


# ---------------------------------------------------------------------------------------------------- outputs

def markdown_report(report: dict) -> str:
    """A short markdown summary of a parity report (what write_report puts in parity.md)."""
    lines = ["# Reward precision parity", ""]
    for note in report.get("notes", []):
        lines.append(f"> {note}")
    if report.get("notes"):
        lines.append("")
    encoder = report.get("encoder")
    if encoder:
        count = len(encoder["images"])
        lines += [f"## Aesthetic scorer on {count} images (each mode against float32)", "",
                  "| mode | cosine mean | cosine min | mean abs score diff | max abs score diff (image) | "
                  "Spearman | bound holds (encoder share / total) |",
                  "|---|---|---|---|---|---|---|"]
        for mode, result in encoder["modes"].items():
            s = result["summary"]
            bound = (f"{s['bound_holds_encoder_share']}/{count} / {s['bound_holds_total']}/{count}"
                     if "bound_holds_total" in s else "n/a")
            lines.append(f"| {mode} | {fmt(s['cosine_mean'], 6)} | {fmt(s['cosine_min'], 6)} | "
                         f"{fmt(s['score_abs_diff_mean'])} | {fmt(s['score_abs_diff_max'])} ({s['worst_image']}) | "
                         f"{fmt(s['spearman'], 3)} | {bound} |")
        if encoder.get("head_weight_norm") is not None:
            lines += ["", f"Bound: |score change| <= |w| sqrt(2 - 2 cos) with |w| = {encoder['head_weight_norm']:.3f} "
                      "(the head is affine). 'Encoder share' scores the mode's embedding with the float32 head, "
                      "which the bound covers exactly; 'total' also includes the head's own rounding."]
        if encoder.get("between_modes"):
            lines += ["", "Low precisions against each other: " + "; ".join(
                f"{pair}: embedding cosine mean {fmt(v['cosine_mean'], 6)} (min {fmt(v['cosine_min'], 6)}), "
                f"mean abs score diff {fmt(v['score_abs_diff_mean'])}, Spearman {fmt(v['spearman'], 3)}"
                for pair, v in encoder["between_modes"].items())]
        layers = next(iter(encoder["modes"].values()))["per_layer"]["cosine_mean"]
        picks = sorted({0, len(layers) // 4, len(layers) // 2, 3 * len(layers) // 4, len(layers) - 1})
        lines += ["", "Per-layer mean token cosine of the hidden states (layer 0 = embeddings after pre-LayerNorm):",
                  "", "| mode | " + " | ".join(f"layer {i}" for i in picks) + " |",
                  "|---|" + "---|" * len(picks)]
        for mode, result in encoder["modes"].items():
            values = result["per_layer"]["cosine_mean"]
            lines.append(f"| {mode} | " + " | ".join(fmt(values[i], 6) for i in picks) + " |")
        lines.append("")
    head = report.get("head_only")
    if head:
        lines += [f"## Head only, on {len(head['embeddings'])} given CLIP embeddings", "",
                  f"float32 scores: {', '.join(f'{v:.3f}' for v in head['fp32_scores'])} "
                  f"(increasing: {head['fp32_monotone']})", "",
                  "| mode | max abs score diff | mean abs score diff | Spearman | still increasing |",
                  "|---|---|---|---|---|"]
        for mode, result in head["modes"].items():
            lines.append(f"| {mode} | {fmt(result['score_abs_diff_max'], 5)} | "
                         f"{fmt(result['score_abs_diff_mean'], 5)} | {fmt(result['spearman'], 3)} | "
                         f"{result['monotone']} |")
        lines.append("")
    return "\n".join(lines)


def plot_report(report: dict, path) -> None:
    """PNG: per-layer drift (1 - cosine, log scale), scores per mode against float32, head-only changes."""
    with needs_extra("align", "the parity report's figure"):
        import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    encoder, head = report.get("encoder"), report.get("head_only")
    if encoder:
        panels += ["layers", "scores"]
    if head:
        panels.append("head")
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for axis, panel in zip(axes[0], panels):
        if panel == "layers":
            for mode, result in encoder["modes"].items():
                drift = np.maximum(1.0 - np.asarray(result["per_layer"]["cosine_mean"]), 1e-12)
                axis.semilogy(range(len(drift)), drift, marker=".", label=mode)
            axis.set(xlabel="layer (0 = embeddings)", ylabel="1 - mean token cosine vs fp32",
                     title="where the encoder's error grows")
            axis.xaxis.get_major_locator().set_params(integer=True)
        elif panel == "scores":
            reference = np.asarray(encoder["fp32_scores"])
            for mode, result in encoder["modes"].items():
                axis.scatter(reference, result["per_image"]["score"], s=18, label=mode)
            low, high = reference.min(), reference.max()
            axis.plot([low, high], [low, high], color="grey", linewidth=0.8, label="y = x")
            axis.set(xlabel="score in fp32", ylabel="score in mode", title="aesthetic score per image")
        else:
            for mode, result in head["modes"].items():
                axis.plot(range(len(result["score_diff"])), result["score_diff"], marker="o", label=mode)
            axis.set(xlabel="embedding (rating 0..9)", ylabel="score change vs fp32", title="head only")
        axis.legend(fontsize=8)
    title = report.get("title")
    if title:
        figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110, format="png")
    plt.close(figure)


def write_report(report: dict, out_dir) -> dict:
    """Write parity.json, parity.md and parity.png under `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "parity.json", "markdown": out_dir / "parity.md", "plot": out_dir / "parity.png"}
    safe = json_safe(report)
    atomic_write(paths["json"], lambda tmp: Path(tmp).write_text(json.dumps(safe, indent=1)))
    atomic_write(paths["markdown"], lambda tmp: Path(tmp).write_text(markdown_report(report)))
    atomic_write(paths["plot"], lambda tmp: plot_report(report, tmp))
    umask = os.umask(0)
    os.umask(umask)
    for path in paths.values():  # atomic_write's temporary files are private (0600); reports are for reading
        os.chmod(path, 0o666 & ~umask)
    return paths
