#!/usr/bin/env python
"""Time the README's first quick-start command on a fresh clone, then score the model it trained.

    python -m lab.perf.demo_fresh_clone                      # clone HEAD into a temporary folder, run `make demo`
    python -m lab.perf.demo_fresh_clone --extra_seeds 1 2    # then train seeds 1 and 2 the same way, score all three

The clone gets its own `.venv` (so the install is timed too; pip's download cache is whatever this machine has,
recorded in the file). Wall time is measured around `make demo` as a whole, with the load average before and
after: run it on an idle machine (check `uptime`). The checkpoint is then scored with dalle_lab/quality.py
(generate.py's default sampling) and both go into one results file with the commit, the command and the machine
(CPU model and kind, lab.common.write_results). `--extra_seeds` trains more models with scripts/demo.sh's recipe
(`--seed S`, untimed beyond their own wall seconds) so the quality comes with a t-interval over seeds. The default
file name carries the CPU kind and the time, so no earlier results file is overwritten.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dalle_lab.provenance import cpu_kind
from dalle_lab.stats import mean_ci
from lab.common import ROOT, git_commit, write_results


def run_timed(command: list[str], cwd: Path, log: Path, env: dict | None = None) -> dict:
    """Run `command` under /usr/bin/time -v; wall seconds (our clock) and the peak RSS time reports."""
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(["/usr/bin/time", "-v", *command], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                              env=None if env is None else {**os.environ, **env})
    wall = time.perf_counter() - start
    peak_kb = next((int(line.split(":")[1]) for line in log.read_text().splitlines()
                    if "Maximum resident set size" in line), None)
    return {"returncode": done.returncode, "wall_s": wall, "peak_rss_kb": peak_kb}


def score(clone: Path, checkpoint: str) -> dict:
    """dalle_lab.quality on one of the clone's checkpoints (generate.py's default sampling)."""
    out = clone / (checkpoint.replace("/", "_") + ".quality.json")
    subprocess.run([str(clone / ".venv/bin/python"), "-m", "dalle_lab.quality", "--dalle_path", checkpoint,
                    "--json", str(out)], cwd=clone, check=True)
    return json.loads(out.read_text())


def quality_over_runs(qualities: list[dict]) -> dict:
    """Accuracy and exact match per caption set: each run's value, their mean and 95 % t-interval across runs."""
    return {f"{split}.{name}": {"per_run": values, **mean_ci(values).to_dict()}
            for split in ("validation", "heldout") for name in ("accuracy", "exact_match")
            for values in [[quality[split][name] for quality in qualities]]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="results file (default: lab/perf/results/demo_fresh_clone-<cpu kind>-"
                   "<time>.json)")
    p.add_argument("--extra_seeds", type=int, nargs="*", default=[], help="train and score these seeds too")
    p.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    args = p.parse_args(argv)

    commit = git_commit()
    folder = Path(tempfile.mkdtemp(prefix="dalle_lab_demo_"))
    clone = folder / "dalle_lab"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    record = {"script": "lab/perf/demo_fresh_clone.py", "command": "make demo", "commit": commit,
              "clone": str(clone), "cpu_count": os.cpu_count(), "load_before": os.getloadavg(),
              "pip_cache_present": (Path.home() / ".cache" / "pip").exists(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    print(f"make demo in {clone} (load {record['load_before'][0]:.2f}) ...", flush=True)
    record["make_demo"] = run_timed(["make", "demo"], clone, folder / "make_demo.log")
    record["load_after"] = os.getloadavg()
    metrics = [json.loads(line) for line in (clone / "runs/dalle/dalle-metrics.jsonl").read_text().splitlines()]
    record["last_logged"] = metrics[-1]
    print(f"make demo: {record['make_demo']['wall_s']:.0f} s (rc {record['make_demo']['returncode']})", flush=True)
    if record["make_demo"]["returncode"] != 0:
        print((folder / "make_demo.log").read_text()[-3000:])
        return 1
    record["quality"] = score(clone, "runs/dalle/dalle.pt")
    # make demo trains with train_dalle.py's default seed; the extra runs add --seed S to the same recipe
    record["extra_seeds"] = {}
    for seed in args.extra_seeds:
        run_dir = f"runs/dalle-seed{seed}"
        timed = run_timed(["bash", "scripts/demo.sh", "--seed", str(seed)], clone, folder / f"demo_seed{seed}.log",
                          env={"RUN_DIR": run_dir, "OUT_DIR": f"outputs-seed{seed}"})
        if timed["returncode"] != 0:
            print((folder / f"demo_seed{seed}.log").read_text()[-3000:])
            return 1
        record["extra_seeds"][seed] = {"wall_s": timed["wall_s"], "quality": score(clone, f"{run_dir}/dalle.pt")}
    record["quality_over_runs"] = quality_over_runs([record["quality"]] +
                                                    [run["quality"] for run in record["extra_seeds"].values()])
    kind = "avx512_bf16" if cpu_kind()["avx512_bf16"] else "avx2"
    write_results(record, args.out or f"lab/perf/results/demo_fresh_clone-{kind}-{time.strftime('%Y%m%d-%H%M')}.json")
    if not args.keep:
        subprocess.run(["rm", "-rf", str(folder)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
