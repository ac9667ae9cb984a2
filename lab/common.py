"""What every lab script shares: the repository's paths, the commit it ran at, and how a results file is written.

Lab scripts run as modules from the repository root (`python -m lab.studies.align.seeds ...`), so `lab` and
`dalle_lab` import from this checkout without any sys.path edits (see lab/README.md).
"""
from __future__ import annotations

import json
from pathlib import Path

from dalle_lab.provenance import cpu_kind, git_state, load_average, machine

ROOT = Path(__file__).resolve().parents[1]  # the repository root
LAB = ROOT / "lab"
STUDIES = LAB / "studies"
PERF_RESULTS = LAB / "perf" / "results"


def git_commit() -> str | None:
    """The HEAD commit of this checkout (None outside git)."""
    return git_state(ROOT)["commit"]


def loadavg() -> float:
    """The 1-minute load average: what the perf scripts print beside each measurement."""
    return (load_average() or [float("nan")])[0]


def results_path(out: str | Path) -> Path:
    """`out` as given when absolute, else relative to the repository root (where results files are named from)."""
    path = Path(out)
    return path if path.is_absolute() else ROOT / path


def write_results(record: dict, out: str | Path) -> Path:
    """Write `record` as indented JSON to `out` (relative to the repository root) and say where.

    A "machine" entry (CPU kind: avx512_bf16 or not; core count; load average at the time of writing) is added
    unless the record has one: a number means little without the processor that made it and how busy it was."""
    path = results_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = record if "machine" in record else {**record, "machine": machine()}
    path.write_text(json.dumps(record, indent=1))
    print(f"wrote {path}")
    return path


__all__ = ["LAB", "PERF_RESULTS", "ROOT", "STUDIES", "cpu_kind", "git_commit", "git_state", "load_average", "loadavg",
           "machine", "results_path", "write_results"]
