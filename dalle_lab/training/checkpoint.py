"""The one checkpoint format, for plain and DeepSpeed training, and for generation.

A checkpoint is a single file holding a dict (see docs/interfaces.md); a DeepSpeed run's also has a directory of
DeepSpeed's per-rank engine files beside it (deepspeed_files.py):

    format          CHECKPOINT_FORMAT
    config          DALLEConfig as a dict: rebuilds the transformer exactly
    tokenizer       the text tokenizer's identity (kind, path, sha256)
    vae             the image tokenizer's identity (its weights are never copied in)
    model           the transformer's state dict, float32 (under DeepSpeed its master weights: deepspeed_weights.py)
  training checkpoints add
    optimizer, scheduler, scaler, step, epoch, data_position, rng (one entry per rank),
    train_config, run, wandb_run_id, nonfinite_skipped, engine, deepspeed (the engine directory's name, layout and
    each rank's files)

It is written atomically (temporary file + rename, dalle_lab.utils.atomic_torch_save) and read with
`torch.load(weights_only=True)`, which is why every RNG state is stored as tensors and plain lists.
"""
from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

from .deepspeed_files import engine_dir_of, remove_engine_dirs
from .errors import CheckpointError

CHECKPOINT_FORMAT = "dalle_lab.checkpoint/1"


# ---------------------------------------------------------------- RNG states as weights_only-safe values

def capture_rng() -> dict:
    import numpy as np
    import torch

    version, mt_state, gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "state": torch.tensor(mt_state, dtype=torch.int64), "gauss": gauss},
        "numpy": {"kind": np_kind, "keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    nps = state["numpy"]
    np.random.set_state((nps["kind"], nps["keys"].numpy().astype(np.uint32), nps["pos"], nps["has_gauss"],
                         nps["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------- writing

def model_state_without_vae(model) -> dict:
    """The transformer's weights only: a frozen VAE attached to the model is recorded by identity instead."""
    return {k: v for k, v in model.state_dict().items() if not k.startswith("vae.")}


def make_checkpoint(*, config: dict, tokenizer_identity: dict, vae_identity: dict, model: dict,
                    **training_state: Any) -> dict:
    return {
        "format": CHECKPOINT_FORMAT,
        "config": dict(config),
        "tokenizer": dict(tokenizer_identity),
        "vae": dict(vae_identity),
        "model": model,
        **training_state,
    }


def save_checkpoint(checkpoint: dict, path: str | os.PathLike) -> Path:
    from dalle_lab.utils import atomic_torch_save

    return atomic_torch_save(checkpoint, path)


def step_checkpoint_path(directory: str | os.PathLike, name: str, step: int) -> Path:
    return Path(directory) / f"{name}-step{step:08d}.pt"


def link_latest(step_path: Path, latest_path: Path) -> None:
    """latest_path becomes the same file as step_path, atomically (a hard link renamed over it; a copy where the
    file system has no hard links), so the newest checkpoint is always at one stable name."""
    import shutil

    from dalle_lab.utils import fsync_path

    tmp = latest_path.with_name(f".{latest_path.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(step_path, tmp)
    except OSError:
        shutil.copyfile(step_path, tmp)
        fsync_path(tmp)
    os.replace(tmp, latest_path)
    fsync_path(latest_path.parent)  # durable before rotation may delete the previous step file


def rotate_checkpoints(directory: str | os.PathLike, name: str, keep_n: int | None,
                       current_step: int | None = None) -> list[Path]:
    """Delete all but the newest `keep_n` step checkpoints of run `name`, each with its DeepSpeed engine directory,
    and engine directories no step file names (left by an interrupted save). Call it only once the newest
    checkpoint and the latest link are durable. `current_step`, the step just saved, is always kept: step files
    after it (written before a resume from an older checkpoint) are neither counted nor deleted.
    Returns the deleted paths."""
    pattern = re.compile(rf"^{re.escape(name)}-step(\d+)\.pt$")
    found = sorted(
        (int(m.group(1)), p) for p in Path(directory).glob(f"{name}-step*.pt") if (m := pattern.match(p.name))
    )
    doomed = []
    if keep_n and keep_n > 0:
        counted = [p for step, p in found if current_step is None or step <= current_step]
        doomed = counted[:-keep_n]
    for p in doomed:
        p.unlink(missing_ok=True)  # the file first: an engine directory without its file is never resumed from
    named = {engine_dir_of(p).name for _, p in found if p not in doomed}
    return doomed + remove_engine_dirs(directory, f"{name}-step", keep=named)


def clear_run(directory: str | os.PathLike, name: str) -> list[Path]:
    """Delete what run `name` wrote into `directory` (train_dalle.py --overwrite): its latest and step checkpoints
    with their DeepSpeed engine directories, its metrics file and its sample grids. Returns the deleted paths."""
    directory = Path(directory)
    doomed = [directory / f"{name}.pt", directory / f"{name}-metrics.jsonl",
              *directory.glob(f"{name}-step*.pt"), *(directory / "samples").glob("step*.png")]
    doomed = [p for p in doomed if p.is_file()]
    for path in doomed:
        path.unlink()
    return doomed + remove_engine_dirs(directory, f"{name}-step", keep=set())


# ---------------------------------------------------------------- reading

def read_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict:
    """Load and validate a checkpoint file, with errors that say what is wrong and what to do."""
    import pickle

    import torch

    from dalle_lab.utils import error_reason

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist: pass the .pt file train_dalle.py wrote "
                              f"(by default runs/dalle/dalle.pt)")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes): a save was interrupted or the copy failed; use another "
                              "checkpoint of the run (its -stepNNNNNNNN.pt files) or copy it again")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as err:
        raise CheckpointError(f"{path} is not a readable dalle_lab checkpoint ({error_reason(err, 200)}); it may be "
                              "truncated, empty or from another program") from err
    if isinstance(ckpt, dict) and "hparams" in ckpt and "weights" in ckpt and "format" not in ckpt:
        raise CheckpointError(f"{path} is a DALLE-pytorch checkpoint: convert it first: python -m dalle_lab.convert "
                              f"dallepytorch {path} OUT.pt --bpe_path ITS_VOCABULARY (generate.py and "
                              "dalle_lab.load_dalle also read it directly)")
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        found = ckpt.get("format") if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(f"{path} is not a dalle_lab DALLE checkpoint (format {found!r}, expected "
                              f"{CHECKPOINT_FORMAT!r}); a VAE file is not a DALLE checkpoint")
    return ckpt


def is_training_checkpoint(ckpt: dict) -> bool:
    return "step" in ckpt and ("optimizer" in ckpt or "deepspeed" in ckpt)


def check_identities(ckpt: dict, tokenizer_identity: dict, vae_identity: dict, path="checkpoint") -> None:
    """Refuse to continue a run with another vocabulary or image tokenizer than the one it was trained with."""
    for what, recorded, current, flag in (
        ("text tokenizer", ckpt.get("tokenizer", {}), tokenizer_identity, "--bpe_path"),
        ("image tokenizer (VAE)", ckpt.get("vae", {}), vae_identity, "--vqgan_model_path/--vqgan_config_path"),
    ):
        if recorded.get("sha256") != current.get("sha256") or recorded.get("kind") != current.get("kind"):
            raise CheckpointError(
                f"{path} was trained with a different {what}: it recorded {_describe(recorded)}, this run uses "
                f"{_describe(current)}. Continue with the recorded one (drop or fix {flag}), or start a new run "
                f"instead of resuming."
            )


def _describe(identity: dict) -> str:
    where = identity.get("path") or identity.get("model_path") or identity.get("kind")
    return f"{where} (sha256 {str(identity.get('sha256'))[:12]})"


def beside_checkpoint(identity: dict, path) -> dict:
    """The identity with each recorded file that does not exist here replaced by the file of the same name beside
    the checkpoint (or inside `path` when it is a folder of token shards), where there is one: a run folder copied or
    moved as a whole keeps working. The loaders still check each file's sha256 against the record, so a different
    file of the same name is refused, not used."""
    if not isinstance(identity, dict) or path is None:
        return identity
    base = Path(path)
    folder = base if base.is_dir() else base.parent
    moved = dict(identity)
    for key, value in identity.items():
        if key.endswith("path") and isinstance(value, str) and value and not Path(value).is_file():
            candidate = folder / Path(value).name
            if candidate.is_file():
                moved[key] = str(candidate)
    return moved


def tokenizer_from_identity(identity: dict, path="checkpoint"):
    """Rebuild the text tokenizer a checkpoint recorded (the shipped default is found from the package, a moved
    file beside the checkpoint)."""
    from dalle_lab.tokenizers import load_tokenizer

    try:
        return load_tokenizer(beside_checkpoint(identity, path))
    except (FileNotFoundError, ValueError, KeyError) as err:
        raise CheckpointError(f"{path} needs the text tokenizer it was trained with: {err} (or put it beside the "
                              "checkpoint under the same name)") from err


def vae_from_identity(identity: dict, path="checkpoint"):
    from dalle_lab.vae import load_vae

    try:
        return load_vae(beside_checkpoint(identity, path))
    except FileNotFoundError as err:
        flag = {"taming_vqgan": ", or copy that VQGAN here and pass it with --vqgan_model_path/--vqgan_config_path",
                "dallepytorch_discrete_vae": " (train_dalle.py also takes --vae_path)"}.get(identity.get("kind"), "")
        raise CheckpointError(f"{path} needs the image tokenizer it was trained with: {err}; put that file at the "
                              f"recorded path or beside the checkpoint under the same name{flag}") from err
    except (ValueError, KeyError) as err:
        raise CheckpointError(f"{path} needs the image tokenizer it was trained with: {err}") from err


def build_model(config: dict, vae=None):
    from dalle_lab.model import DALLE, DALLEConfig

    return DALLE.from_config(DALLEConfig(**config), vae=vae)


def load_model_state(model, state: dict, path="checkpoint") -> None:
    """Load transformer weights; a VAE attached to `model` is allowed to be missing from `state`. Weights whose
    shapes disagree with the model the checkpoint's config builds are a one-line CheckpointError, not torch's
    page of size mismatches."""
    expected = model.state_dict()
    for name, tensor in state.items():
        if name in expected and tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                f"{path}: its config and its weights disagree: weight {name} is {tuple(tensor.shape)} but the config "
                f"({_config_fields_for(model, tuple(expected[name].shape))}) makes it {tuple(expected[name].shape)}; "
                f"the file was edited or mixes two models: use the checkpoint train_dalle.py wrote")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("vae.")]
    if missing or unexpected:
        raise CheckpointError(f"{path} does not match the model its config describes (missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]}); the file may come from another version of dalle_lab")


def _config_fields_for(model, shape: tuple) -> str:
    """The config fields whose values appear in a weight's shape: the likely culprits of a mismatch."""
    config = getattr(model, "config", None)
    if config is None:
        return "?"
    import dataclasses

    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    extra = {"total_text_tokens": getattr(config, "total_text_tokens", None),
             "inner dim (heads * dim_head)": config.heads * config.dim_head}
    found = [f"{name}={value}" for name, value in {**values, **extra}.items()
             if isinstance(value, int) and not isinstance(value, bool) and value in shape and value > 1]
    return ", ".join(found) or "its fields"


def load_dalle(path: str | os.PathLike, device="cpu", bpe_path=None, vqgan_paths=None):
    """(dalle, tokenizer, vae) from a checkpoint, ready for generation: eval mode, on `device`.

    bpe_path / vqgan_paths (model .ckpt, config .yaml): where the recorded vocabulary / VQGAN are now, for a
    checkpoint whose files moved (generate.py --bpe_path, --vqgan_model_path + --vqgan_config_path). They must be
    the very files it was trained with: the recorded hashes are checked, as for the recorded paths.
    """
    ckpt = read_checkpoint(path)
    tokenizer_identity, vae_identity = ckpt["tokenizer"], ckpt["vae"]
    if bpe_path is not None:
        if not Path(bpe_path).is_file():
            raise CheckpointError(f"--bpe_path {bpe_path} does not exist: pass the vocabulary {path} was trained with "
                                  f"(it recorded {_describe(tokenizer_identity)})")
        tokenizer_identity = {**tokenizer_identity, "path": str(bpe_path)}
    if vqgan_paths is not None:
        for given in vqgan_paths:
            if not Path(given).is_file():
                raise CheckpointError(f"--vqgan_model_path/--vqgan_config_path {given} does not exist: pass the VQGAN "
                                      f"{path} was trained with (it recorded {_describe(vae_identity)})")
        vae_identity = {**vae_identity, "model_path": str(vqgan_paths[0]), "config_path": str(vqgan_paths[1])}
    tokenizer = tokenizer_from_identity(tokenizer_identity, path)
    vae = vae_from_identity(vae_identity, path)
    dalle = build_model(ckpt["config"], vae=vae)
    load_model_state(dalle, ckpt["model"], path)
    dalle.to(device).eval()
    vae.to(device).eval()
    return dalle, tokenizer, vae
