#!/usr/bin/env python
"""Summarise the calibration runs of lab/studies/recipe/sweep.py: one table row per recipe (mean over its seeds, with
a t-based 95% confidence interval across seeds when there are several), for each sampling setting.

    python -m lab.studies.recipe.report                       # reads lab/studies/recipe/results/runs/*.json
    python -m lab.studies.recipe.report --out lab/studies/recipe/results/README.md --sampling default

Writes a markdown report (the calibration table docs/training.md points to) and a summary JSON beside it. Nothing is
typed in by hand: every number comes from the run files, which hold their commands, commits and load averages.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from dalle_lab import stats
from lab.common import ROOT


def mean_ci(values) -> tuple[float, float | None]:
    """Mean and the half-width of a t-based 95% CI across seeds (None for a single seed)."""
    interval = stats.mean_ci(values)
    return interval.mean, interval.half_width if interval.n > 1 else None


def fmt(mean: float, half: float | None) -> str:
    return f"{mean:.3f}" if half is None else f"{mean:.3f} ± {half:.3f}"


def load_runs(folder: Path) -> dict[str, list[dict]]:
    runs = defaultdict(list)
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        name = path.stem.rsplit("-seed", 1)[0]
        record["file"] = str(path.relative_to(ROOT))
        runs[name].append(record)
    return runs


def summarise(runs: dict[str, list[dict]], sampling: str) -> list[dict]:
    rows = []
    for name, records in runs.items():
        usable = [r for r in records if sampling in r["eval"]]
        if not usable:
            continue
        row = {"name": name, "seeds": [r["seed"] for r in usable], "flags": " ".join(usable[0]["train_flags"]),
               "processes": usable[0].get("processes", 1), "files": [r["file"] for r in usable], "sampling": sampling,
               "settings": usable[0]["eval"][sampling]["settings"]}
        for split in ("val", "heldout"):
            for metric in ("accuracy", "exact_match"):
                row[f"{split}_{metric}"] = mean_ci([r["eval"][sampling][split][metric] for r in usable])
        row["val_loss_img"] = mean_ci([r["eval"]["losses"]["val"]["loss_img"] for r in usable])
        walls = [r["train_wall_s"] for r in usable if r.get("train_wall_s")]
        row["train_wall_s"] = mean_ci(walls) if walls else None
        row["load"] = [round(r["load_before"][0], 1) for r in usable]
        rows.append(row)
    return rows


def markdown(rows: list[dict], sampling: str) -> str:
    lines = [f"# Main-job recipe calibration (sampling: `{sampling}`)", "",
             "Written by `python -m lab.studies.recipe.report` from the run files of `lab/studies/recipe/sweep.py` "
             "(one per recipe and seed, in `runs/`). Mean over seeds; ± is a t-based 95% CI across seeds. With several "
             "DDP processes `--batch_size` is per process.", "",
             "| recipe | train_dalle.py flags | processes | sampling | seeds | val accuracy | val exact | held-out accuracy | held-out exact "
             "| val image loss | train wall s (load) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        wall = "" if r["train_wall_s"] is None else f"{r['train_wall_s'][0]:.0f} ({', '.join(map(str, r['load']))})"
        shown = ", ".join(f"{k} {v}" for k, v in r["settings"].items() if v is not None)
        lines.append(f"| {r['name']} | `{r['flags'] or '(defaults)'}` | {r['processes']} | {shown} | {len(r['seeds'])} | {fmt(*r['val_accuracy'])} "
                     f"| {fmt(*r['val_exact_match'])} | {fmt(*r['heldout_accuracy'])} | {fmt(*r['heldout_exact_match'])}"
                     f" | {fmt(*r['val_loss_img'])} | {wall} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="lab/studies/recipe/results/runs")
    p.add_argument("--out", default="lab/studies/recipe/results/README.md")
    p.add_argument("--sampling", default="default", help="which sampling setting of the run files to tabulate")
    args = p.parse_args(argv)
    rows = summarise(load_runs(ROOT / args.runs), args.sampling)
    text = markdown(rows, args.sampling)
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
