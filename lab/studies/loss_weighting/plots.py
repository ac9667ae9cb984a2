"""The loss-weighting study's figures: training loss curves per setting (mean over seeds and the seeds' range),
attribute accuracy and exact match per setting (mean, 95 % CI, seeds), and a grid of generated samples for the
held-out compositions. matplotlib is imported inside the functions, so importing this module stays light.
"""
from __future__ import annotations

import math
from pathlib import Path

from .config import SAMPLES_FILE
from .runs import run_dir


def _smooth(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_curves(settings, results: list[dict], path: Path) -> Path | None:
    """Training loss_text and loss_img against steps: per setting the mean over seeds (moving average) and the
    seeds' range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), dpi=90)
    drawn = False
    for index, setting in enumerate(settings):
        runs = [r for r in results if r["setting"] == setting.name and r["curves"]["step"]]
        if not runs:
            continue
        length = min(len(r["curves"]["step"]) for r in runs)
        steps = runs[0]["curves"]["step"][:length]
        window = max(1, length // 20)
        colour = f"C{index}"
        for ax, key in zip(axes, ("loss_text", "loss_img")):
            curves = [_smooth(r["curves"][key][:length], window) for r in runs]
            mean = [sum(c[i] for c in curves) / len(curves) for i in range(length)]
            ax.plot(steps, mean, color=colour, label=f"{setting.label} ({len(runs)} seeds)", linewidth=1.3)
            if len(curves) > 1:
                ax.fill_between(steps, [min(c[i] for c in curves) for i in range(length)],
                                [max(c[i] for c in curves) for i in range(length)], color=colour, alpha=0.15,
                                linewidth=0)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    axes[0].set_title("text loss (all positions, training)")
    axes[0].set_yscale("log")  # a long text context's pads pull its curve far below the short one's
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    axes[0].yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axes[0].yaxis.set_major_formatter(ScalarFormatter())
    axes[0].yaxis.set_minor_formatter(NullFormatter())
    axes[1].set_title("image loss (training)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_accuracy(settings, summary: dict, path: Path) -> Path | None:
    """Attribute accuracy and exact match per setting: bars = mean, error bars = 95 % CI, dots = seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [s for s in settings if s.name in summary]
    if not present:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), dpi=90)
    width = 0.38
    for ax, metric in zip(axes, ("accuracy", "exact_match")):
        for offset, split, colour in ((-width / 2, "val", "C0"), (width / 2, "heldout", "C1")):
            key = f"{split}_{metric}"
            xs, means, errors = [], [], []
            for i, setting in enumerate(present):
                interval = summary[setting.name].get(key)
                if interval is None:
                    continue
                xs.append(i + offset)
                means.append(interval["mean"])
                errors.append(interval["half_width"] if math.isfinite(interval["half_width"]) else 0.0)
                ax.scatter([i + offset] * len(interval["values"]), interval["values"], color="black", s=8, zorder=3)
            ax.bar(xs, means, width, yerr=errors, capsize=3, color=colour, alpha=0.8,
                   label="validation captions" if split == "val" else "held-out compositions")
        ax.set_xticks(range(len(present)))
        ax.set_xticklabels([s.label for s in present], fontsize=8)
        tops = [v for s in present for split in ("val", "heldout")
                for v in summary[s.name].get(f"{split}_{metric}", {}).get("values", [])]
        # exact match can be a few percent: zoom in rather than draw flat bars on a 0..1 axis
        ax.set_ylim(0, 1 if metric == "accuracy" else min(1.0, max(0.1, 1.3 * max(tops, default=0.0))))
        ax.set_title("attribute accuracy" if metric == "accuracy" else "exact match")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_samples(config, settings, results: list[dict], path: Path) -> Path | None:
    """One row per setting: the seed-0 (else first) run's images for the first held-out captions."""
    import numpy as np
    from PIL import Image


    rows = []
    for setting in settings:
        mine = sorted((r for r in results if r["setting"] == setting.name), key=lambda r: r["seed"])
        if not mine:
            continue
        file = run_dir(config, setting, mine[0]["seed"]) / SAMPLES_FILE
        if not file.is_file():
            continue
        with np.load(file) as data:
            if "heldout" not in data:
                continue
            rows.append((setting.label, data["heldout"]))
    if not rows:
        return None
    from PIL import ImageDraw

    scale, pad, label_w = 2, 2, 70
    size = rows[0][1].shape[1] * scale
    columns = max(len(images) for _, images in rows)
    canvas = Image.new("RGB", (label_w + columns * (size + pad), len(rows) * (size + pad) + pad), "white")
    draw = ImageDraw.Draw(canvas)
    for r, (label, images) in enumerate(rows):
        y = pad + r * (size + pad)
        draw.text((4, y + size // 2 - 5), label, fill="black")
        for c, array in enumerate(images):
            tile = Image.fromarray(array).resize((size, size), Image.NEAREST)
            canvas.paste(tile, (label_w + c * (size + pad), y))
    canvas.save(path)
    return path


__all__ = ["plot_accuracy", "plot_curves", "plot_samples"]
