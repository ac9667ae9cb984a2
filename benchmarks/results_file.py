"""What every benchmark results file starts with and how it is written: one place for the commit and the write."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git_commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def write_results(record: dict, out: str) -> Path:
    """Write `record` as indented JSON to `out` (relative to the repository root) and say where."""
    path = ROOT / out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    print(f"wrote {path}")
    return path
