"""Reward hacking against KL strength: one `python -m dalle_lab.align` run per KL setting, then the frontier.

    python benchmarks/align_kl_sweep.py --name kl_sweep_jpeg --parallel 2 \\
        --settings kl_coef=0.01 kl_coef=0.1 kl_coef=0.5 kl_target=10 -- \\
        --dalle_path runs/dalle/dalle.pt --reward jpeg_compressibility --epochs 16

Each setting adds its flags (`kl_coef=0.1` -> `--kl_coef 0.1`; join several with commas) to the align command given
after `--`. The in-run evaluation (validation captions and held-out compositions, generate.py's sampling) gives, per
setting: the reward's gain on fresh samples in standard errors of the difference, the checker's attribute accuracy
and exact match lost, the KL to the starting model and the image loss on real validation images. Writes
reports/align/<name>.json (commands, commit, load, raw values) and <name>_frontier.png.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def setting_flags(setting: str) -> list[str]:
    flags = []
    for part in setting.split(","):
        name, _, value = part.partition("=")
        if not value:
            raise SystemExit(f"--settings {setting!r}: expected name=value[,name=value]")
        flags += [f"--{name.strip()}", value.strip()]
    return flags


def frontier_row(setting: str, results: dict, split: str = "val") -> dict:
    start, final = results["start"], results["final"]

    def get(row, key):
        return row.get(f"eval_{split}_{key}", math.nan)

    gain = get(final, "reward") - get(start, "reward")
    se = math.sqrt(get(final, "reward_se") ** 2 + get(start, "reward_se") ** 2)
    return {"setting": setting, "split": split, "reward_start": get(start, "reward"), "reward_final": get(final, "reward"),
            "reward_gain": gain, "reward_gain_se": gain / se if se > 0 else math.nan,
            "accuracy_start": get(start, "accuracy"), "accuracy_final": get(final, "accuracy"),
            "accuracy_drop": get(start, "accuracy") - get(final, "accuracy"),
            "exact_match_start": get(start, "exact_match"), "exact_match_final": get(final, "exact_match"),
            "kl_ref_image": get(final, "kl_ref_image"), "loss_img_start": start.get("eval_loss_img"),
            "loss_img_final": final.get("eval_loss_img"), "images_sampled": results["images_sampled"],
            "train_s": results["train_s"], "train_cpu_s": results.get("train_cpu_s"),
            "kl_coef_final": results.get("kl_coef_final")}


def plot_frontier(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for row in rows:
        for ax, x in ((axes[0], row["kl_ref_image"]), (axes[1], row["accuracy_drop"])):
            ax.scatter([x], [row["reward_gain_se"]], s=30)
            ax.annotate(row["setting"], (x, row["reward_gain_se"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
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
    from align_seeds import run_seed

    from dalle_lab.align.in_run_eval import git_commit

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("give the align command's arguments after --")
    own, align_args = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="kl_sweep_jpeg")
    parser.add_argument("--settings", nargs="+", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--runs_dir", default="runs/align_kl_sweep")
    parser.add_argument("--report_dir", default="reports/align")
    parser.add_argument("--report_only", action="store_true")
    args = parser.parse_args(own)
    runs = Path(args.runs_dir) / args.name
    label = {s: s.replace("=", "").replace(",", "_") for s in args.settings}
    record = {"name": args.name, "script_argv": argv, "git": git_commit(), "seed": args.seed,
              "cpu_count": os.cpu_count(), "load_average_before": os.getloadavg(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if not args.report_only:
        pending, active = list(args.settings), []
        while pending or active:
            while pending and len(active) < args.parallel:
                s = pending.pop(0)
                active.append((s, run_seed(align_args + setting_flags(s), args.seed, runs / label[s],
                                           runs / f"{label[s]}.log")))
            time.sleep(5)
            for s, proc in list(active):
                if proc.poll() is not None:
                    active.remove((s, proc))
                    print(f"[kl_sweep] {s} finished with exit status {proc.returncode}", flush=True)
    rows, raw = [], {}
    for s in args.settings:
        path = runs / label[s] / "results.json"
        if not path.is_file():
            print(f"[kl_sweep] {s}: no {path}", file=sys.stderr)
            continue
        results = json.loads(path.read_text())
        log = [json.loads(line) for line in (runs / label[s] / "log.jsonl").read_text().splitlines()]
        results["kl_coef_final"] = log[-1].get("kl_coef") if log else None
        raw[s] = {k: results[k] for k in ("command", "config", "git", "epochs", "images_sampled", "train_s",
                                          "train_cpu_s", "wall_s", "load_average_end", "start", "final")}
        rows += [frontier_row(s, results, split) for split in ("val", "heldout")]
    record.update({"load_average_after": os.getloadavg(), "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                   "frontier": rows, "runs": raw})
    out = Path(args.report_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    val_rows = [r for r in rows if r["split"] == "val"]
    if val_rows:
        plot_frontier(val_rows, out / f"{args.name}_frontier.png",
                      f"{args.name}: gain vs KL and faithfulness lost (seed {args.seed})")
    for r in val_rows:
        print(f"  {r['setting']}: reward {r['reward_start']:.4f} -> {r['reward_final']:.4f} "
              f"({r['reward_gain_se']:.1f} SE), accuracy {r['accuracy_start']:.3f} -> {r['accuracy_final']:.3f}, "
              f"KL {r['kl_ref_image']:.1f} nats/image")
    print(f"[kl_sweep] wrote {out / (args.name + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
