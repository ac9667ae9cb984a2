"""Run one `python -m dalle_lab.align` configuration for several training seeds, sequentially, and write its results
file: can RL on captions without images teach the held-out compositions (docs/align.md, lab/studies/align/README.md)?

    python -m lab.studies.align.compositions --name taught --seeds 0 1 2 -- \\
        --dalle_path /work/runs/demo_base/dalle.pt --reward shapes_faithfulness --prompts heldout --epochs 40
    python -m lab.studies.align.compositions --report taught leave_out ...   # the table of finished results files
    python -m lab.studies.align.compositions --compare taught taught_uniform_credit   # Welch, per measure

Everything after `--` goes to the align command unchanged; this script adds `--seed S --out_dir RUNS/<name>/seed<S>`.
Runs use fixed image counts (`--epochs`), not time budgets, so a loaded machine changes their seconds, not their
numbers. A seed whose results.json exists is not run again; an interrupted seed resumes from its align_state.pt.
The evaluation of the starting model is deterministic (fixed sampling seeds), so it runs once per model and evaluation
setting (the arguments that decide it, threads included: STARTS/<key>.json) and the other runs skip it
(`--eval_at_start false`); each seed's record says which run's start it took.
The results file (`results/<name>.json`, written by this script only) holds: the command, the align config, the git
commit, the seeds, the machine (CPU kind: the avx512_bf16 flag; lab.common.write_results) and load averages, every
seed's raw start and final evaluation, training curve, images, seconds and CPU seconds, and for each measure the mean
change from the start with its 95 % Student-t interval across seeds (seeds.py's t_interval).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dalle_lab.stats import mean_ci, welch_test
from lab.common import ROOT, STUDIES, git_state, write_results
from lab.studies.align.seeds import t_interval

RESULTS = STUDIES / "align" / "results"
HISTORY_KEYS = ("epoch", "images_sampled", "elapsed_s", "cpu_s", "reward_mean", "reward_std", "kl_ref_image",
                "informative_fraction", "updated_images", "entropy", "approx_kl", "clipfrac", "grad_norm")


# the align arguments that decide the start evaluation (the model, the evaluation sets, their sampling, the threads)
START_ARGS = ("--dalle_path", "--prompts", "--leave_out_pair", "--eval_prompts", "--num_shapes_prompts", "--threads",
              "--reward")


def start_key(align_args: list[str]) -> str:
    pairs = [(a, align_args[i + 1]) for i, a in enumerate(align_args[:-1])
             if a in START_ARGS or a.startswith("--eval_") and a not in ("--eval_every", "--eval_at_start")]
    model = Path(dict(pairs).get("--dalle_path", ""))
    model_hash = hashlib.sha256(model.read_bytes()).hexdigest()[:16] if model.is_file() else ""
    return hashlib.sha256(json.dumps([model_hash, sorted(pairs)]).encode()).hexdigest()[:16]


def run_seed(align_args: list[str], seed: int, out_dir: Path, eval_at_start: bool) -> int:
    command = [sys.executable, "-m", "dalle_lab.align", *align_args, "--seed", str(seed), "--out_dir", str(out_dir),
               "--eval_at_start", str(eval_at_start).lower()]
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="disabled")
    with open(out_dir / "run.log", "a") as log:
        return subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode


def training_history(out_dir: Path) -> list[dict]:
    path = out_dir / "log.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return [{k: row[k] for k in HISTORY_KEYS if k in row} for row in rows]


def summarise(results: dict[int, dict]) -> dict:
    """{measure: {"start": [...], "final": t_interval, "change": t_interval, "per_seed_final", "final_se"}}."""
    first = next(iter(results.values()))["final"]
    summary = {}
    for key in (k for k in first if k.startswith("eval_") and not k.endswith("_se") and k != "eval_s"):
        finals = {s: r["final"][key] for s, r in results.items() if key in r["final"]}
        starts = {s: r["start"][key] for s, r in results.items() if key in r["start"]}
        summary[key[5:]] = {"start": sorted(set(starts.values())), "final": t_interval(finals.values()),
                            "change": t_interval([finals[s] - starts[s] for s in finals if s in starts]),
                            "per_seed_final": finals,
                            "final_se": {s: r["final"].get(key + "_se") for s, r in results.items()}}
    return summary


def with_start(out_dir: Path, starts: Path, key: str) -> dict:
    """The seed's results.json, its start evaluation shared through STARTS/<key>.json (written by the first run)."""
    result = json.loads((out_dir / "results.json").read_text())
    path = starts / f"{key}.json"
    if result["start"] is not None:
        if not path.is_file():
            starts.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"start": result["start"], "from": str(out_dir)}) + "\n")
        return result | {"start_from": str(out_dir)}
    shared = json.loads(path.read_text())
    return result | {"start": shared["start"], "start_from": shared["from"]}


def measure(args, align_args: list[str]) -> int:
    runs = Path(args.runs_dir) / args.name
    starts, key = Path(args.runs_dir) / "starts", start_key(align_args)
    record = {"name": args.name, "script_argv": sys.argv, "git": git_state(ROOT), "seeds": args.seeds,
              "load_average_before": os.getloadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    for seed in args.seeds:
        out_dir = runs / f"seed{seed}"
        if not (out_dir / "results.json").is_file():
            print(f"[compositions] {args.name} seed {seed}: running ({out_dir / 'run.log'})", flush=True)
            status = run_seed(align_args, seed, out_dir, eval_at_start=not (starts / f"{key}.json").is_file())
            print(f"[compositions] {args.name} seed {seed}: exit status {status}", flush=True)
            if status == 0:
                with_start(out_dir, starts, key)  # the first run of this key shares its start evaluation
    results = {s: with_start(runs / f"seed{s}", starts, key)
               for s in args.seeds if (runs / f"seed{s}" / "results.json").is_file()}
    if not results:
        return 1
    first = results[min(results)]
    keep = ("epochs", "images_sampled", "train_s", "train_cpu_s", "wall_s", "stop_reason", "start_from",
            "load_average_start",
            "load_average_end", "cpu_native_bf16", "git", "start", "final", "evals", "rl_prompts")
    record.update({
        "load_average_after": os.getloadavg(), "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "align_command": first["command"], "config": first["config"], "eval_sets": first["eval_sets"],
        "eval_sampling": first["eval_sampling"], "eval_captions": first.get("eval_captions"),
        "per_seed": {s: {k: r[k] for k in keep if k in r} | {"history": training_history(runs / f"seed{s}")}
                     for s, r in results.items()},
        "summary": summarise(results),
    })
    out = write_results(record, RESULTS / f"{args.name}.json")
    print(report_rows([out]))
    return 0


ROW_MEASURES = ("heldout_accuracy", "heldout_exact_match", "left_out_accuracy", "left_out_exact_match",
                "val_accuracy", "val_exact_match", "heldout_kl_ref_image", "heldout_diversity_pixel")


def _cell(entry: dict | None, key: str) -> str:
    if entry is None:
        return ""
    part = entry[key]
    half = part["ci95_half"]
    sign = "+" if key == "change" and part["mean"] >= 0 else ""
    return f"{sign}{part['mean']:.3f}" + (f" +- {half:.3f}" if half is not None else "")


def report_rows(paths: list[Path]) -> str:
    """A markdown table: per results file, start -> final (change +- 95 % t) of the row measures."""
    lines = ["| run | images | " + " | ".join(ROW_MEASURES) + " |", "|---|---|" + "---|" * len(ROW_MEASURES)]
    for path in paths:
        record = json.loads(Path(path).read_text())
        images = sorted({r["images_sampled"] for r in record["per_seed"].values()})
        cells = []
        for key in ROW_MEASURES:
            entry = record["summary"].get(key)
            cells.append("" if entry is None else
                         f"{entry['start'][0]:.3f} -> {_cell(entry, 'final')} ({_cell(entry, 'change')})")
        lines.append(f"| {record['name']} ({len(record['per_seed'])} seeds) | {images} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def relative_changes(paths: list[Path], key: str = "heldout_diversity_pixel") -> str:
    """Per results file, the measure's final over its start minus one, each seed's, with the 95 % t-interval (issue
    34 bounds pixel diversity's fall at 20 % of the start)."""
    lines = []
    for path in paths:
        record = json.loads(Path(path).read_text())
        entry = record["summary"].get(key)
        if entry is None:
            continue
        start = entry["start"][0]
        ratios = [final / start - 1 for final in entry["per_seed_final"].values()]
        interval = mean_ci(ratios)
        lines.append(f"{record['name']}: {key} {start:.4f} -> per seed "
                     + ", ".join(f"{r:+.1%}" for r in ratios)
                     + f"; mean {interval.mean:+.1%} +- {interval.half_width:.1%}")
    return "\n".join(lines)


def compare(path_a: Path, path_b: Path) -> str:
    """Welch's t-test, per row measure, of the per-seed finals of two results files (a minus b)."""
    a, b = (json.loads(Path(p).read_text()) for p in (path_a, path_b))
    lines = [f"{a['name']} minus {b['name']} (per-seed finals, Welch 95 % interval):"]
    for key in ROW_MEASURES:
        if key in a["summary"] and key in b["summary"]:
            result = welch_test(list(a["summary"][key]["per_seed_final"].values()),
                                list(b["summary"][key]["per_seed_final"].values()))
            lines.append(f"  {key}: {result.difference:+.3f} +- {result.half_width:.3f} (p = {result.p_value:.3f})")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    align_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", help="results/<name>.json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs_dir", default=str(ROOT / "runs" / "align_study"))
    parser.add_argument("--report", nargs="+", metavar="NAME", help="print the table of these results files, and "
                        "each one's relative change of pixel diversity")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="Welch's test of A's per-seed finals minus B's")
    args = parser.parse_args(own)
    if args.report:
        paths = [RESULTS / f"{name}.json" for name in args.report]
        print(report_rows(paths) + "\n\n" + relative_changes(paths))
    if args.compare:
        print(compare(*(RESULTS / f"{name}.json" for name in args.compare)))
    if args.report or args.compare:
        return 0
    if not args.name or not align_args:
        parser.error("give --name and the align command's arguments after --")
    return measure(args, align_args)


if __name__ == "__main__":
    sys.exit(main())
