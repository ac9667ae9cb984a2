#!/usr/bin/env python
"""Time the README's first quick-start command on a fresh clone, then score the model it trained.

    python -m lab.perf.demo_fresh_clone                      # clone HEAD into a temporary folder, run `make demo`
    python -m lab.perf.demo_fresh_clone --out lab/perf/results/demo_fresh_clone.json

The clone gets its own `.venv` (so the install is timed too; pip's download cache is whatever this machine has,
recorded in the file). Wall time is measured around `make demo` as a whole, with the load average before and
after: run it on an idle machine (check `uptime`). The checkpoint is then scored with dalle_lab/quality.py
(generate.py's default sampling) and both go into one results file with the commit and the command.
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

from lab.common import ROOT, git_commit, results_path


def run_timed(command: list[str], cwd: Path, log: Path) -> dict:
    """Run `command` under /usr/bin/time -v; wall seconds (our clock) and the peak RSS time reports."""
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(["/usr/bin/time", "-v", *command], cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    peak_kb = next((int(line.split(":")[1]) for line in log.read_text().splitlines()
                    if "Maximum resident set size" in line), None)
    return {"returncode": done.returncode, "wall_s": wall, "peak_rss_kb": peak_kb}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="lab/perf/results/demo_fresh_clone.json")
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
    quality = clone / "quality.json"
    subprocess.run([str(clone / ".venv/bin/python"), "-m", "dalle_lab.quality", "--dalle_path",
                    "runs/dalle/dalle.pt", "--json", str(quality)], cwd=clone, check=True)
    record["quality"] = json.loads(quality.read_text())
    out = results_path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    print(f"wrote {out}")
    if not args.keep:
        subprocess.run(["rm", "-rf", str(folder)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
