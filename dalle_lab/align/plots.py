"""Figures of the alignment runs: reward curves, one or several methods on one axis (image grids: dalle_lab.viz).

matplotlib is imported inside the functions (Agg backend, no display needed) so importing the trainers stays light.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from dalle_lab.extras import needs_extra


def _save(fig, path) -> Path:
    with needs_extra("align", "the alignment run's reward curves"):
        import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_reward_curves(histories: Mapping[str, Sequence[dict]], path, title: str = "reward",
                       x: str = "images_sampled") -> Path:
    """Reward mean +- std against `x` and against wall-clock seconds of fine-tuning (`elapsed_s`) for each named
    run; a last panel shows the KL to the starting model when the runs logged it (`kl_ref_image`, per image)."""
    with needs_extra("align", "the alignment run's reward curves"):
        import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_kl = any("kl_ref_image" in row for rows in histories.values() for row in rows)
    fig, axes = plt.subplots(1, 3 if has_kl else 2, figsize=(15 if has_kl else 10, 3.8), squeeze=False)
    for name, rows in histories.items():
        rows = [row for row in rows if "reward_mean" in row]
        if not rows:
            continue
        mean = np.array([row["reward_mean"] for row in rows])
        std = np.array([row.get("reward_std", 0.0) for row in rows])
        color = None
        for ax, key in ((axes[0, 0], x), (axes[0, 1], "elapsed_s")):
            xs = np.array([row.get(key, np.nan) for row in rows], dtype=float)
            (line,) = ax.plot(xs, mean, marker="o", markersize=3, label=name, color=color)
            color = line.get_color()
            ax.fill_between(xs, mean - std, mean + std, color=color, alpha=0.15)
        if has_kl:
            xs = np.array([row[x] for row in rows], dtype=float)
            kl = [row.get("kl_ref_image", np.nan) for row in rows]
            axes[0, 2].plot(xs, kl, marker="o", markersize=3, color=color, label=name)
    for ax, key in ((axes[0, 0], x), (axes[0, 1], "elapsed_s")):
        ax.set_xlabel("seconds of fine-tuning" if key == "elapsed_s" else key.replace("_", " "))
        ax.set_ylabel("reward (mean +- std over the epoch's samples)")
        ax.set_title(title)
        ax.legend()
    if has_kl:
        axes[0, 2].set_xlabel(x.replace("_", " "))
        axes[0, 2].set_ylabel("KL to the starting model (nats per image)")
        axes[0, 2].set_title("KL to reference")
    return _save(fig, path)


def plot_eval_curves(rows: Sequence[dict], path, title: str = "evaluation") -> Path:
    """The in-run evaluations against images sampled: every `eval_<set>_<measure>` series, one panel per measure
    (accuracy, exact match, reward, KL, ...), one line per evaluation set."""
    with needs_extra("align", "the alignment run's reward curves"):
        import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[str, list]] = {}
    for key in dict.fromkeys(k for row in rows for k in row if k.startswith("eval_") and k != "eval_s"
                                   and not k.endswith("_se")):
        parts = key[5:].split("_", 1)
        measure, label = (parts[1], parts[0]) if len(parts) == 2 and parts[0] in ("val", "heldout", "prompts") \
            else (key[5:], "")
        series.setdefault(measure, {})[label] = [(row["images_sampled"], row[key]) for row in rows if key in row]
    n = max(1, len(series))
    cols = min(4, n)
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(4 * cols, 3.2 * ((n + cols - 1) // cols)),
                             squeeze=False)
    for ax, (measure, lines) in zip(axes.flat, series.items()):
        for label, points in lines.items():
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", markersize=3, label=label or None)
        ax.set_title(measure.replace("_", " "))
        ax.set_xlabel("images sampled")
        if any(lines):
            ax.legend()
    for ax in list(axes.flat)[len(series):]:
        ax.axis("off")
    fig.suptitle(f"{title}: fresh samples for captions never used as RL prompts")
    return _save(fig, path)
