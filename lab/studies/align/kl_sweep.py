"""Reward hacking against KL strength: one `python -m dalle_lab.align` run per KL setting, then the frontier.

    python -m lab.studies.align.kl_sweep --name kl_sweep_jpeg --parallel 2 \\
        --settings kl_coef=0.01 kl_coef=0.1 kl_coef=0.5 kl_target=10 -- \\
        --dalle_path runs/dalle/dalle.pt --reward jpeg_compressibility --epochs 16

Each setting adds its flags (`kl_coef=0.1` -> `--kl_coef 0.1`; join several with commas) to the align command given
after `--`. The in-run evaluation (validation captions and held-out compositions, generate.py's sampling) gives, per
setting: the reward's gain on fresh samples in standard errors of the difference, the checker's attribute accuracy
and exact match lost, the KL to the starting model and the image loss on real validation images. `--seeds 0 1 2`
runs every setting for each training seed and adds the mean and 95 % t-interval across seeds; `--frontier_reward
TERM` judges the gain on one term of a weighted-sum reward (e.g. the JPEG term of a reward that also pays for
faithfulness). Writes lab/studies/align/results/<name>.json (commands, commit, load, raw values) and <name>_frontier.png.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path


def setting_flags(setting: str) -> list[str]:
    flags = []
    for part in setting.split(","):
        name, _, value = part.partition("=")
        if not value:
            raise SystemExit(f"--settings {setting!r}: expected name=value[,name=value]")
        flags += [f"--{name.strip()}", value.strip()]
    return flags


def frontier_row(setting: str, results: dict, split: str = "val", reward_term: str | None = None) -> dict:
    """One run's point of the frontier. reward_term: judge the gain on this term of a weighted-sum reward (its own
    mean and standard error, logged by the in-run evaluation) rather than on the whole reward."""
    start, final = results["start"], results["final"]

    def get(row, key):
        return row.get(f"eval_{split}_{key}", math.nan)

    reward = "reward"
    if reward_term and f"eval_{split}_reward_{reward_term}" in final:
        reward = f"reward_{reward_term}"
    gain = get(final, reward) - get(start, reward)
    se = math.sqrt(get(final, f"{reward}_se") ** 2 + get(start, f"{reward}_se") ** 2)
    return {"setting": setting, "split": split, "reward": reward,
            "reward_start": get(start, reward), "reward_final": get(final, reward),
            "reward_gain": gain, "reward_gain_se": gain / se if se > 0 else math.nan,
            "accuracy_start": get(start, "accuracy"), "accuracy_final": get(final, "accuracy"),
            "accuracy_drop": get(start, "accuracy") - get(final, "accuracy"),
            "exact_match_start": get(start, "exact_match"), "exact_match_final": get(final, "exact_match"),
            "kl_ref_image": get(final, "kl_ref_image"), "loss_img_start": start.get("eval_loss_img"),
            "loss_img_final": final.get("eval_loss_img"), "images_sampled": results["images_sampled"],
            "train_s": results["train_s"], "train_cpu_s": results.get("train_cpu_s"),
            "kl_coef_final": results.get("kl_coef_final")}


def across_seeds(rows: list[dict]) -> list[dict]:
    """Per setting and split with two or more seeds: mean and 95 % t-interval across training seeds of the gain, the
    gain in standard errors, the accuracy lost and the KL (run-to-run spread, not evaluation noise)."""
    from lab.studies.align.seeds import t_interval

    out = []
    for setting, split in dict.fromkeys((r["setting"], r["split"]) for r in rows):
        mine = [r for r in rows if r["setting"] == setting and r["split"] == split]
        if len(mine) < 2:
            continue
        out.append({"setting": setting, "split": split, "seeds": [r["seed"] for r in mine],
                    **{key: t_interval([r[key] for r in mine])
                       for key in ("reward_gain", "reward_gain_se", "accuracy_drop", "exact_match_start",
                                   "exact_match_final", "kl_ref_image", "loss_img_final")}})
    return out


def short_label(setting: str) -> str:
    """A setting as a legend entry: reward names shortened (jpeg_compressibility -> jpeg, ...)."""
    for long, short in (("jpeg_compressibility", "jpeg"), ("shapes_faithfulness", "faithfulness"), ("reward=", "")):
        setting = setting.replace(long, short)
    return setting


def plot_frontier(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    settings = list(dict.fromkeys(row["setting"] for row in rows))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labelled = set()
    for row in rows:  # one colour per setting, one point per training seed, one legend entry per setting
        colour = colours[settings.index(row["setting"]) % len(colours)]
        label = None if row["setting"] in labelled else short_label(row["setting"])
        labelled.add(row["setting"])
        for ax, x in ((axes[0], row["kl_ref_image"]), (axes[1], row["accuracy_drop"])):
            ax.scatter([x], [row["reward_gain_se"]], s=30, color=colour, label=label if ax is axes[0] else None)
    axes[0].legend(fontsize=7, loc="best")
    axes[0].set_xlabel("KL to the starting model (nats per image)")
    axes[1].set_xlabel("checker attribute accuracy lost (validation captions)")
    axes[1].axvline(0.05, color="grey", linestyle=":", linewidth=1)
    for ax in axes:
        ax.axhline(10, color="grey", linestyle=":", linewidth=1)
        ax.set_ylabel("reward gain on fresh samples (standard errors)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    from dalle_lab.provenance import git_state as git_commit
    from lab.studies.align.seeds import run_seed

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv and not {"-h", "--help"} & set(argv):
        raise SystemExit("give the align command's arguments after --")
    own, align_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="kl_sweep_jpeg")
    parser.add_argument("--settings", nargs="+", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="training seeds of every setting (seed 0 runs in runs_dir/<name>/<setting>, seed S in "
                             "<setting>_seed<S>); the report takes the seeds whose runs finished")
    parser.add_argument("--frontier_reward", default=None,
                        help="judge the gain on this term of a weighted-sum reward, e.g. jpeg_compressibility when "
                             "the reward is jpeg_compressibility:1+shapes_faithfulness:0.5")
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--runs_dir", default="runs/align_kl_sweep")
    parser.add_argument("--report_dir", default="lab/studies/align/results")
    parser.add_argument("--report_only", action="store_true")
    args = parser.parse_args(own)
    runs = Path(args.runs_dir) / args.name
    label = {s: s.replace("=", "").replace(",", "_") for s in args.settings}
    tasks = [(s, seed) for seed in args.seeds for s in args.settings]

    def run_path(s: str, seed: int) -> Path:
        return runs / (label[s] if seed == 0 else f"{label[s]}_seed{seed}")

    record = {"name": args.name, "script_argv": argv, "git": git_commit(), "seeds": args.seeds,
              "cpu_count": os.cpu_count(), "load_average_before": os.getloadavg(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if not args.report_only:
        pending, active = list(tasks), []
        while pending or active:
            while pending and len(active) < args.parallel:
                s, seed = pending.pop(0)
                path = run_path(s, seed)
                active.append(((s, seed), run_seed(align_args + setting_flags(s), seed, path,
                                                   path.with_name(path.name + ".log"))))
            time.sleep(5)
            for task, proc in list(active):
                if proc.poll() is not None:
                    active.remove((task, proc))
                    print(f"[kl_sweep] {task[0]} seed {task[1]} finished with exit status {proc.returncode}",
                          flush=True)
    rows, raw = [], {}
    for s, seed in tasks:
        path = run_path(s, seed) / "results.json"
        if not path.is_file():
            print(f"[kl_sweep] {s} seed {seed}: no {path}", file=sys.stderr)
            continue
        results = json.loads(path.read_text())
        log = [json.loads(line) for line in (path.parent / "log.jsonl").read_text().splitlines()]
        results["kl_coef_final"] = log[-1].get("kl_coef") if log else None
        raw[f"{s} seed {seed}"] = {k: results[k] for k in ("command", "config", "git", "epochs", "images_sampled",
                                                            "train_s", "train_cpu_s", "wall_s", "load_average_end",
                                                            "start", "final")}
        rows += [frontier_row(s, results, split, args.frontier_reward) | {"seed": seed}
                 for split in ("val", "heldout")]
    record.update({"load_average_after": os.getloadavg(), "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                   "frontier": rows, "across_seeds": across_seeds(rows), "runs": raw})
    out = Path(args.report_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    val_rows = [r for r in rows if r["split"] == "val"]
    if val_rows:
        plot_frontier(val_rows, out / f"{args.name}_frontier.png",
                      f"{args.name}: gain vs KL and faithfulness lost (one point per training seed)")
    for r in val_rows:
        print(f"  {r['setting']} seed {r['seed']}: {r['reward']} {r['reward_start']:.4f} -> {r['reward_final']:.4f} "
              f"({r['reward_gain_se']:.1f} SE), accuracy {r['accuracy_start']:.3f} -> {r['accuracy_final']:.3f}, "
              f"KL {r['kl_ref_image']:.1f} nats/image")
    print(f"[kl_sweep] wrote {out / (args.name + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
