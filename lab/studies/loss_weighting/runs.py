"""Where the loss-weighting study keeps its runs, and when a stored run may stand in for training it again.

Each finished (setting, seed) leaves <runs_dir>/<setting>/seed<k>/result.json with the run's identity: everything
that decides its numbers. A stored result is reused only when that identity matches exactly; one whose training
differs is an error, never a silent mix. The same check admits runs from an earlier report's results.json
(--import_results) and finds the finished runs for --report_only.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from .config import Setting, StudyConfig

RESULT_FILE = "result.json"


def run_dir(config: StudyConfig, setting: Setting, seed: int) -> Path:
    return Path(config.runs_dir) / setting.name / f"seed{seed}"


def run_identity(config: StudyConfig, setting: Setting, seed: int, vae_identity: dict, tokenizer_identity: dict) -> dict:
    """Everything that decides a run's numbers: a cached result is reused only when this matches exactly."""
    identity = {"setting": asdict(setting), "seed": seed, "model": config.model_overrides(setting),
                "train": {k: getattr(config, k) for k in ("steps", "batch_size", "learning_rate", "warmup_steps",
                                                          "amp")},
                "eval": config.eval.to_dict(), "vae_sha256": vae_identity.get("sha256"),
                "tokenizer_sha256": tokenizer_identity.get("sha256")}
    if config.objects is not None:  # only then, so the runs of studies without it keep their identity
        identity["objects"] = config.objects.to_dict()
    return identity


EVALUATION_KEYS = ("eval", "objects")  # a change in these re-evaluates a trained run; any other change is an error


def training_part(identity: dict) -> dict:
    """What decides the trained weights (everything but the evaluation settings)."""
    return {k: v for k, v in identity.items() if k not in EVALUATION_KEYS}


def load_cached(path: Path, identity: dict, key: str | None = "identity") -> dict | None:
    """The JSON at `path` (a finished result, or with key=None a started run's identity) if it was made with
    `identity`; None if there is none, or if only the evaluation settings differ (the trained checkpoint is then
    evaluated again); an error if the training differs (a study's directory must not silently mix runs)."""
    if not path.is_file():
        return None
    stored = json.loads(path.read_text())
    recorded = stored.get(key) if key else stored
    if _normalise(recorded) == _normalise(identity):
        return stored
    if isinstance(recorded, dict) and _normalise(training_part(recorded)) == _normalise(training_part(identity)):
        return None
    raise ValueError(f"{path} holds a run trained with other settings ({recorded}) than this study's "
                     f"({identity}); pass another --runs_dir (and --out_dir), or delete {path.parent} to redo it")


def _normalise(value):
    return json.loads(json.dumps(value))  # tuples -> lists, as they come back from JSON


def read_curves(metrics_path: Path) -> dict:
    """Loss curves from the training loop's metrics file. A resumed run re-logs the steps after its last
    checkpoint; the later record of a step wins."""
    by_step: dict[int, dict] = {}
    if metrics_path.is_file():
        for line in metrics_path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                by_step[int(record["step"])] = record
    steps = sorted(by_step)
    return {"step": steps, **{k: [by_step[s][k] for s in steps] for k in ("loss", "loss_text", "loss_img")}}


def final_train_losses(curves: dict, fraction: float = 0.1) -> dict:
    """Training losses averaged over the last `fraction` of the logged steps (one batch's loss is noisy)."""
    count = max(1, math.ceil(len(curves["step"]) * fraction))
    return {k: sum(curves[k][-count:]) / count for k in ("loss", "loss_text", "loss_img")} | {
        "from_step": curves["step"][-count] if curves["step"] else None}


def _same_settings(recorded: dict, expected: dict) -> bool:
    """Identities equal up to the tokenizers' hashes (those are checked when run_study loads the result: reading
    them here could mean training the default image tokenizer)."""
    def without_hashes(identity):
        return _normalise({k: v for k, v in identity.items() if not k.endswith("_sha256")})
    return without_hashes(recorded) == without_hashes(expected)


def collect_cached(config: StudyConfig, log=print) -> list[dict]:
    """Finished results in runs_dir made with this config's settings (for --report_only); runs of other settings
    are skipped."""
    results = []
    for setting, seed in config.tasks():
        path = run_dir(config, setting, seed) / RESULT_FILE
        if not path.is_file():
            continue
        result = json.loads(path.read_text())
        if not _same_settings(result.get("identity", {}), run_identity(config, setting, seed, {}, {})):
            log(f"skipping {path}: made with other settings than these flags")
            continue
        results.append(result)
    return results


def import_results(config: StudyConfig, results_path: str | Path, log=print) -> int:
    """Seed runs_dir with the finished runs of an earlier report's results.json (its "runs" list), so a study that
    continues on another machine, whose runs_dir is gone, trains only what is missing. A run is taken only for a
    (setting, seed) of this config whose recorded identity (settings, model, schedule, evaluation) matches this
    config's, and never over a result already in runs_dir; the tokenizers' hashes are checked later, when run_study
    loads each cached result (a mismatch there is an error, not a silent reuse). Returns how many were written."""
    from dalle_lab.utils import atomic_write

    path = Path(results_path)
    if not path.is_file():
        raise FileNotFoundError(f"--import_results {path}: no such file (give a study's results.json)")
    runs = json.loads(path.read_text()).get("runs")
    if not isinstance(runs, list):
        raise ValueError(f"--import_results {path}: no 'runs' list in it (is it a loss-weighting results.json?)")
    by_task = {(r.get("setting"), r.get("seed")): r for r in runs}
    written = 0
    for setting, seed in config.tasks():
        run = by_task.get((setting.name, seed))
        target = run_dir(config, setting, seed) / RESULT_FILE
        if run is None or target.is_file():
            continue
        if not _same_settings(run.get("identity", {}), run_identity(config, setting, seed, {}, {})):
            log(f"not importing {setting.label} seed {seed}: {path} ran it with other settings than these flags")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        record = {**run, "imported_from": str(path)}
        record.pop("cached", None)
        atomic_write(target, lambda tmp: Path(tmp).write_text(json.dumps(record, indent=1)))
        written += 1
    log(f"imported {written} finished runs from {path}")
    return written
