"""Two (or more) fine-tuning methods side by side, from their `align_seeds.py` results files.

    python -m lab.studies.align.seeds --name clip_score_pg --seeds 0 1 2 --parallel 2 -- --method policy_gradient ...
    python -m lab.studies.align.seeds --name clip_score_rb --seeds 0 1 2 --parallel 2 -- --method reward_backprop ...
    python -m lab.studies.align.method_compare --name compare_clip_score \\
        --methods policy_gradient=clip_score_pg reward_backprop=clip_score_rb

Reads lab/studies/align/results/<report>.json for each `label=report` (written by align_seeds.py: every seed's in-run
evaluations and training curve) and writes lab/studies/align/results/<name>.json and <name>.png: for each method and each
evaluation point, the mean and the 95 % Student-t interval across training seeds of the reward and the Shapes
checker's accuracy on captions that were never RL prompts, against images sampled and against seconds of
fine-tuning; and the change from the start at the end of the runs. The evaluation at a point uses the same captions
and sampling seed for every run, so the spread across seeds is run-to-run spread, not evaluation noise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


MEASURES = ("val_reward", "val_accuracy", "val_exact_match", "heldout_reward", "heldout_accuracy",
            "heldout_exact_match", "val_kl_ref_image", "loss_img")


def method_curves(report: dict) -> dict:
    """Per evaluation point (matched by position: every seed evaluates after the same epochs): across-seed
    mean and interval of each measure's change from the start, with the mean images sampled and seconds."""
    from lab.studies.align.seeds import t_interval

    runs = [run for run in report["per_seed"].values() if run.get("evals")]
    points = min(len(run["evals"]) for run in runs)
    curve = []
    for i in range(points):
        rows = [run["evals"][i] for run in runs]
        starts = [run["evals"][0] for run in runs]
        point = {"images_sampled": sum(r["images_sampled"] for r in rows) / len(rows),
                 "elapsed_s": sum(r["elapsed_s"] for r in rows) / len(rows), "seeds": len(rows)}
        for key in MEASURES:
            if all(f"eval_{key}" in r for r in rows):
                point[key] = t_interval([r[f"eval_{key}"] for r in rows])
                point[f"{key}_change"] = t_interval([r[f"eval_{key}"] - s[f"eval_{key}"]
                                                     for r, s in zip(rows, starts)])
        curve.append(point)
    return {"seeds": sorted(report["per_seed"]), "align_command": report.get("align_command"),
            "config": report.get("config"), "eval_curve": curve, "final": curve[-1],
            "training_curves": {seed: run.get("history", []) for seed, run in report["per_seed"].items()}}


def plot(methods: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = [(axes[0, 0], "images_sampled", "val_reward_change", "reward gain, validation captions"),
              (axes[0, 1], "elapsed_s", "val_reward_change", "reward gain, validation captions"),
              (axes[1, 0], "images_sampled", "val_accuracy_change", "checker accuracy change, validation"),
              (axes[1, 1], "images_sampled", "heldout_accuracy_change", "checker accuracy change, held-out")]
    for label, data in methods.items():
        curve = data["eval_curve"]
        for ax, x_key, y_key, y_label in panels:
            xs = [p[x_key] for p in curve if y_key in p]
            ys = [p[y_key]["mean"] for p in curve if y_key in p]
            half = [p[y_key]["ci95_half"] or 0.0 for p in curve if y_key in p]
            line, = ax.plot(xs, ys, marker="o", label=label)
            ax.fill_between(xs, [y - h for y, h in zip(ys, half)], [y + h for y, h in zip(ys, half)],
                            color=line.get_color(), alpha=0.2)
            ax.set_xlabel("images sampled" if x_key == "images_sampled" else "seconds of fine-tuning")
            ax.set_ylabel(y_label)
            ax.axhline(0, color="grey", linewidth=0.8)
    axes[0, 0].legend()
    fig.suptitle(title + " (mean and 95 % t-interval across training seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    from dalle_lab.provenance import git_state as git_commit

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="lab/studies/align/results/<name>.json and .png")
    parser.add_argument("--methods", nargs="+", required=True, help="label=report: lab/studies/align/results/<report>.json")
    parser.add_argument("--report_dir", default="lab/studies/align/results")
    args = parser.parse_args(argv)
    out = Path(args.report_dir)
    methods = {}
    for item in args.methods:
        label, _, report = item.partition("=")
        path = out / f"{report or label}.json"
        if not path.is_file():
            raise SystemExit(f"--methods {item}: no {path}; run lab/studies/align/seeds.py --name {report or label} first")
        methods[label] = {"report": str(path), **method_curves(json.loads(path.read_text()))}
    record = {"name": args.name, "script_argv": sys.argv[1:] if argv is None else argv, "git": git_commit(),
              "cpu_count": os.cpu_count(), "load_average": os.getloadavg(),
              "written": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "methods": methods}
    (out / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(methods, out / f"{args.name}.png", args.name)
    for label, data in methods.items():
        final = data["final"]
        parts = [f"{final['images_sampled']:.0f} images, {final['elapsed_s']:.0f} s"]
        for key in ("val_reward", "val_accuracy", "heldout_accuracy", "val_kl_ref_image"):
            if f"{key}_change" in final:
                change = final[f"{key}_change"]
                half = change["ci95_half"]
                parts.append(f"{key} {change['mean']:+.4f}" + (f" +- {half:.4f}" if half is not None else ""))
        print(f"  {label} ({len(data['seeds'])} seeds): " + ", ".join(parts))
    print(f"[align_method_compare] wrote {out / (args.name + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
