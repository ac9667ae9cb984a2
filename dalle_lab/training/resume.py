"""Which settings a resume may change, and the refusal when it changes one that shapes the run.

A checkpoint records the run's TrainConfig (`train_config`), its model (`config`) and what the engine actually ran
(`run`: world size, micro-batch, accumulation steps, the LR horizon). A resume that would train differently from
the interrupted run - another batch size, world size, accumulation, model field, data, seed, optimiser or precision
setting, LR horizon - is refused with one message naming every changed flag and its saved value. Settings that
cannot change the result (logging, sample grids, checkpoint interval, workers, time budget, output paths) may
change freely.

train_dalle.py takes every such setting the command line does not give from the checkpoint, so a bare `--resume`
continues the run as it was started (`settings_from_checkpoint`).
"""
from __future__ import annotations

import dataclasses

from .errors import CheckpointError
from .config import TrainConfig

# TrainConfig fields that shape the trained weights. The tokenizer and image tokenizer paths are not here: their
# identities (file hashes) are checked instead, and a moved file with the same hash is the same run.
RUN_FIELDS = ("dataset", "image_text_folder", "wds", "truncate_captions", "skip_long_captions",
              "random_resize_crop_lower_ratio", "caption_noise", "batch_size",
              "ga_steps", "learning_rate", "weight_decay", "clip_grad_norm", "warmup_steps", "lr_decay",
              "min_lr_ratio", "plateau_patience", "plateau_factor", "amp", "amp_dtype", "seed", "deepspeed",
              "zero_stage")
# run fields newer than some checkpoints: a checkpoint without one trained with this value
_RUN_FIELD_DEFAULTS_BEFORE = {"caption_noise": 0.0}
# fields a bare --resume also takes from the checkpoint (they end the run, or decide its LR horizon)
INHERITED_FIELDS = RUN_FIELDS + ("epochs", "max_steps", "deepspeed_config")
# model fields the data decides, never flags
_DERIVED_MODEL_FIELDS = ("num_image_tokens", "image_fmap_size")


def run_facts(*, world_size: int, micro_batch: int, ga_steps: int, schedule) -> dict:
    """What the engine really ran (a DeepSpeed config may override the flags); saved as checkpoint["run"]. The LR
    horizon counts only where the schedule decays towards it."""
    horizon = schedule.total_steps if schedule.decay in ("cosine", "linear") else None
    return {"world_size": world_size, "micro_batch": micro_batch, "ga_steps": ga_steps, "lr_total_steps": horizon}


def check_resume_settings(ckpt: dict, cfg: TrainConfig, model_overrides: dict, facts: dict | None, path,
                          also: list[str] = ()) -> None:
    """Raise CheckpointError naming every setting that differs from the saved run's (facts None: flags only), and
    the differences `also` names."""
    changed = changed_settings(ckpt, cfg, model_overrides, facts) + list(also)
    if changed:
        raise CheckpointError(
            f"cannot resume {path} exactly: {'; '.join(changed)}. Resume with the saved values (train_dalle.py takes "
            f"any flag you leave out from the checkpoint), or start a new run from its weights with --dalle_path")


def changed_settings(ckpt: dict, cfg: TrainConfig, model_overrides: dict, facts: dict | None) -> list[str]:
    """'--flag value (saved: value)' for every run-shaping setting that differs from the checkpoint's."""
    changed = []
    saved_cfg = ckpt.get("train_config") or {}
    if saved_cfg:
        saved_cfg = {**_RUN_FIELD_DEFAULTS_BEFORE, **saved_cfg}
    for name in RUN_FIELDS:
        if name in saved_cfg and not _same(getattr(cfg, name), saved_cfg[name]):
            changed.append(_flag(name, getattr(cfg, name), saved_cfg[name]))
    saved_model = ckpt.get("config") or {}
    if saved_model:
        # a field the checkpoint predates (e.g. attn_types, rotary_emb) rebuilds with its default: compare with that
        saved_model = {**_model_defaults(), **saved_model}
    changed += differing_model_fields(model_overrides, saved_model)
    saved_facts = (ckpt.get("run") or {}) if facts is not None else {}
    for key, what in (("world_size", "processes (world size)"), ("micro_batch", "micro-batch per process"),
                      ("ga_steps", "gradient accumulation steps"), ("lr_total_steps", "LR decay horizon in steps")):
        if key in saved_facts and saved_facts[key] != facts[key] and not _reported(key, changed):
            hint = {"lr_total_steps": " (from --max_steps / --epochs)",
                    "world_size": " (start as many processes as the saved run)"}.get(key, " (a --deepspeed_config?)")
            changed.append(f"{what} {facts[key]} (saved: {saved_facts[key]}){hint}")
    return changed


def differing_model_fields(model_overrides: dict, saved_model: dict, skip=()) -> list[str]:
    """'--flag value (saved: value)' for each model field given with another value than the saved model's."""
    changed = []
    for name, value in sorted(model_overrides.items()):
        if value == "auto" or name in skip:  # --text_seq_len auto: a continued run keeps the checkpoint's
            continue
        if name in saved_model and name not in _DERIVED_MODEL_FIELDS and not _same(value, saved_model[name]):
            changed.append(_flag(name, value, saved_model[name]))
    return changed


def budget_changes(ckpt: dict, cfg: TrainConfig, given: set[str]) -> list[str]:
    """--max_steps / --epochs given with other values than the saved run's where they set its LR decay horizon
    (cosine, linear decay): named as flags before the run starts (the engine check would refuse the horizon)."""
    saved = ckpt.get("train_config") or {}
    if saved.get("lr_decay") not in ("cosine", "linear"):
        return []
    return [_flag(name, getattr(cfg, name), saved[name]) + " (the LR decay horizon)" for name in ("max_steps", "epochs")
            if name in given and name in saved and not _same(getattr(cfg, name), saved[name])]


def settings_from_checkpoint(cfg: TrainConfig, overrides: dict, given: set[str], ckpt: dict):
    """(cfg, overrides) with every run-shaping flag the command line did not give taken from the checkpoint."""
    saved_cfg = ckpt.get("train_config") or {}
    inherited = {name: saved_cfg[name] for name in INHERITED_FIELDS if name in saved_cfg and name not in given}
    if "sample_captions" not in given and saved_cfg.get("sample_captions"):
        inherited["sample_captions"] = list(saved_cfg["sample_captions"])  # the same grids as before the stop
    cfg = dataclasses.replace(cfg, **inherited)
    saved_model = ckpt.get("config") or {}
    overrides = {name: (value if name in given else saved_model.get(name, value)) for name, value in overrides.items()}
    return cfg, overrides


def _model_defaults() -> dict:
    from dalle_lab.model import DALLEConfig

    return {f.name: f.default for f in dataclasses.fields(DALLEConfig)}


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return tuple(a) == tuple(b)
    if isinstance(a, float) or isinstance(b, float):
        try:
            return float(a) == float(b)
        except (TypeError, ValueError):
            return False
    return a == b


def _flag(name: str, value, saved) -> str:
    return f"--{name} {_shown(value)} (saved: {_shown(saved)})"


def _shown(value):
    """A setting as its flag is written: on/off/unset, comma lists (--attn_types full,axial_row)."""
    if isinstance(value, (bool, type(None))):
        return {True: "on", False: "off", None: "unset"}[value]
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return value


def _reported(key: str, changed: list[str]) -> bool:
    """A fact that follows from a flag already named (--batch_size -> micro-batch) is not named twice."""
    flags = {"micro_batch": "--batch_size ", "ga_steps": "--ga_steps ", "lr_total_steps": "--ga_steps "}
    return key in flags and any(entry.startswith(flags[key]) for entry in changed)
