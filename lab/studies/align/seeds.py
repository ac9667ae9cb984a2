"""Run one `python -m dalle_lab.align` command for several training seeds and write its results file.

    python -m lab.studies.align.seeds --name faithfulness --seeds 0 1 2 --parallel 3 -- \\
        --dalle_path runs/dalle/dalle.pt --preset faithfulness

Everything after `--` is passed to the align CLI unchanged; this script adds `--seed S --out_dir RUNS/<name>/seed<S>
--no_resume`. Each run writes its own results.json (command, config, commit, load, the in-run evaluations before and
after); this script gathers them into lab/studies/align/results/<name>.json: the command, the commit, the seeds, the load average
before and after, every seed's raw start and final values, its in-run evaluations and training curve, and for each
measure the mean across seeds with a 95 % Student-t interval (n - 1 degrees of freedom), for the final value and for
the change from the start. The start is
the same model for every seed and its evaluation samples come from a fixed seed, so the spread of the change is the
run-to-run spread of training, not evaluation noise. `--report_only` rebuilds the file from finished runs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dalle_lab.stats import mean_ci
from lab.common import ROOT


def t_interval(values) -> dict:
    """mean, sample std, and the half-width of the 95 % Student-t interval of the mean (None with one value), as
    this study's results files hold them (dalle_lab.stats.mean_ci computes it)."""
    interval = mean_ci(values)
    if interval.n < 2:
        return {"mean": interval.mean, "std": None, "ci95_half": None, "n": interval.n}
    return {"mean": interval.mean, "std": interval.std, "ci95_half": interval.half_width, "n": interval.n}


def run_seed(align_args: list[str], seed: int, out_dir: Path, log_path: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "dalle_lab.align", *align_args, "--seed", str(seed), "--out_dir", str(out_dir),
               "--no_resume"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)


HISTORY_KEYS = ("epoch", "images_sampled", "elapsed_s", "cpu_s", "reward_mean", "reward_se", "kl_ref_image", "kl_coef")


def training_history(log_path: Path) -> list[dict]:
    """The run's per-epoch training curve (reward of the epoch's own samples against images and seconds)."""
    if not log_path.is_file():
        return []
    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    return [{k: row[k] for k in HISTORY_KEYS if k in row} for row in rows if "epoch" in row]


def summarise(results: dict[int, dict]) -> dict:
    """{measure: {"start": value, "final": t_interval, "change": t_interval, "per_seed": {seed: final}}}."""
    measures = [k for k in next(iter(results.values()))["final"]
                if k.startswith("eval_") and not k.endswith("_se") and k != "eval_s"]
    summary = {}
    for key in measures:
        finals = {seed: r["final"][key] for seed, r in results.items() if key in r["final"]}
        starts = {seed: r["start"][key] for seed, r in results.items() if key in r["start"]}
        changes = [finals[s] - starts[s] for s in finals if s in starts]
        summary[key[5:]] = {"start": sorted(set(starts.values())), "final": t_interval(list(finals.values())),
                            "change": t_interval(changes) if changes else None, "per_seed_final": finals}
    return summary


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    align_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="lab/studies/align/results/<name>.json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--parallel", type=int, default=1, help="runs at the same time")
    parser.add_argument("--runs_dir", default="runs/align_seeds")
    parser.add_argument("--report_dir", default="lab/studies/align/results")
    parser.add_argument("--report_only", action="store_true", help="gather finished runs, start none")
    args = parser.parse_args(own)
    if not align_args and not args.report_only:
        parser.error("give the align command's arguments after --")
    from dalle_lab.provenance import git_state as git_commit

    runs = Path(args.runs_dir) / args.name
    record = {"name": args.name, "script_argv": argv, "git": git_commit(), "seeds": args.seeds,
              "parallel": args.parallel, "cpu_count": os.cpu_count(), "load_average_before": os.getloadavg(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if not args.report_only:
        pending, active = list(args.seeds), []
        while pending or active:
            while pending and len(active) < args.parallel:
                seed = pending.pop(0)
                active.append((seed, run_seed(align_args, seed, runs / f"seed{seed}", runs / f"seed{seed}.log")))
            time.sleep(5)
            for seed, proc in list(active):
                if proc.poll() is not None:
                    active.remove((seed, proc))
                    print(f"[align_seeds] seed {seed} finished with exit status {proc.returncode}", flush=True)
    results = {}
    for seed in args.seeds:
        path = runs / f"seed{seed}" / "results.json"
        if path.is_file():
            results[seed] = json.loads(path.read_text())
        else:
            print(f"[align_seeds] seed {seed}: no {path} (see {runs / f'seed{seed}.log'})", file=sys.stderr)
    if not results:
        return 1
    first = results[min(results)]
    record.update({
        "load_average_after": os.getloadavg(), "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "align_command": first["command"], "config": first["config"], "eval_sets": first["eval_sets"],
        "eval_sampling": first["eval_sampling"],
        "per_seed": {seed: {k: r[k] for k in ("epochs", "images_sampled", "train_s", "train_cpu_s", "wall_s",
                                              "stop_reason", "load_average_end", "git", "start", "final", "evals")
                            if k in r} | {"history": training_history(runs / f"seed{seed}" / "log.jsonl")}
                     for seed, r in results.items()},
        "summary": summarise(results),
    })
    out = Path(args.report_dir) / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"[align_seeds] wrote {out}")
    for key in ("val_accuracy", "val_exact_match", "heldout_accuracy", "heldout_exact_match", "val_kl_ref_image",
                "loss_img", "diversity_distinct", "val_reward"):
        if key in record["summary"]:
            s = record["summary"][key]
            half = s["final"]["ci95_half"]
            print(f"  {key}: start {s['start']} -> {s['final']['mean']:.4f}"
                  + (f" +- {half:.4f} (95% t, {s['final']['n']} seeds)" if half is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
