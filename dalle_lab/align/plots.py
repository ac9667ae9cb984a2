"""Figures of the alignment runs: reward curves, one or several methods on one axis (image grids: dalle_lab.viz).

matplotlib is imported inside the functions (Agg backend, no display needed) so importing the trainers stays light.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np


def plot_reward_curves(histories: Mapping[str, Sequence[dict]], path, title: str = "reward",
                       x: str = "images_sampled") -> Path:
    """Reward mean +- std against `x` for each named run; a second panel shows the KL to the starting model when
    the runs logged it (`kl_ref_image`, the per-image sequence KL)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_kl = any("kl_ref_image" in row for rows in histories.values() for row in rows)
    fig, axes = plt.subplots(1, 2 if has_kl else 1, figsize=(10 if has_kl else 5.5, 3.8), squeeze=False)
    for name, rows in histories.items():
        rows = [row for row in rows if "reward_mean" in row]
        if not rows:
            continue
        xs = np.array([row[x] for row in rows], dtype=float)
        mean = np.array([row["reward_mean"] for row in rows])
        std = np.array([row.get("reward_std", 0.0) for row in rows])
        (line,) = axes[0, 0].plot(xs, mean, marker="o", markersize=3, label=name)
        axes[0, 0].fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.15)
        if has_kl:
            kl = [row.get("kl_ref_image", np.nan) for row in rows]
            axes[0, 1].plot(xs, kl, marker="o", markersize=3, color=line.get_color(), label=name)
    axes[0, 0].set_xlabel(x.replace("_", " "))
    axes[0, 0].set_ylabel("reward (mean +- std over the epoch's samples)")
    axes[0, 0].set_title(title)
    axes[0, 0].legend()
    if has_kl:
        axes[0, 1].set_xlabel(x.replace("_", " "))
        axes[0, 1].set_ylabel("KL to the starting model (nats per image)")
        axes[0, 1].set_title("KL to reference")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
