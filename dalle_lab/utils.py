"""Small helpers shared across the package: device choice, the CPU's and GPU's bfloat16, file identity, atomic
writes. (`import dalle_lab` stays light because the package's __init__ imports nothing until a name is used.)
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import torch


def pick_device(name: str = "auto"):
    """Resolve a device name: "auto" picks CUDA when present, else CPU. Anything torch accepts passes through."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available here; use --device cpu or auto")
    return device


CPU_BF16_VARIABLE = "DALLE_LAB_CPU_BF16"


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (avx512 bf16 / AMX, as torch's oneDNN kernels see it).

    Without it (AVX2-only processors) torch emulates bf16 products, far slower than float32, and oneDNN's prepacked
    bf16 weights (model/linear.py) are refused; the demo recipe, mixed precision, the VAE trainer's precision and
    the packed decode path ask this one function. DALLE_LAB_CPU_BF16=1 or 0 overrides the probe (docs/training.md):
    the tests use it to run both machines' branches on either kind of CPU."""
    forced = os.environ.get(CPU_BF16_VARIABLE, "")
    if forced:
        if forced not in ("0", "1"):
            raise ValueError(f"{CPU_BF16_VARIABLE}={forced!r}: set 1 (treat this CPU as computing bfloat16 "
                             "natively) or 0 (as an AVX2-only CPU), or unset it to ask the CPU")
        return forced == "1"
    return _cpu_probe_bf16()


@lru_cache(maxsize=None)
def _cpu_probe_bf16() -> bool:
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def file_sha256(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes: the identity checkpoints record for tokenizers and image tokenizers."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


def error_reason(err: BaseException, limit: int = 160, with_type: bool = True) -> str:
    """An exception as a short one-line reason, its type first unless `with_type` is off (parsers' messages run over
    several lines; torch.load of an empty file raises an EOFError with no message at all)."""
    text = " ".join(str(err).split())[:limit]
    if not text:
        return type(err).__name__
    return f"{type(err).__name__}: {text}" if with_type else text


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file's (or a directory's entries') data to the disk. Directories cannot be opened on Windows, where
    the rename below is durable by itself."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (IsADirectoryError, PermissionError):
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync directories; nothing more can be done there
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[str], Any]) -> Path:
    """Call `write(tmp_path)`, then rename tmp_path over `path`, durably.

    The rename is atomic on POSIX, so a process killed mid-write leaves the previous file intact. The file is
    fsynced before the rename and its folder after it, so after a power loss `path` holds either the old or the
    new bytes, never an empty or half-written file, and a caller may delete older files once this returns.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        # mkstemp creates 0600 files; give the result the permissions a plain open() would have
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        fsync_path(tmp)
        os.replace(tmp, path)
        fsync_path(path.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    """torch.save through a temporary file and a rename (see atomic_write)."""
    return atomic_write(path, lambda tmp: torch.save(obj, tmp))


def cuda_has_native_bf16(device=None) -> bool:
    """Whether this CUDA GPU computes bfloat16 natively (compute capability 8.0 and newer: A100, H100, RTX 30xx on).

    torch.cuda.is_bf16_supported() also answers yes for older GPUs (V100, T4) that only emulate bfloat16, far more
    slowly; there `--amp` means float16 with dynamic loss scaling instead. The demo recipe and mixed precision ask
    this one function. False without CUDA."""
    if not torch.cuda.is_available():
        return False
    if torch.version.hip:  # ROCm: every GPU torch supports computes bfloat16
        return True
    return torch.cuda.get_device_capability(device)[0] >= 8


def open_wandb(name: str, entity: str | None = None, project: str = "dalle_lab", run_id: str | None = None,
               config: dict | None = None):
    """The wandb run every trainer logs to (train_dalle, train_vae, align): wandb is imported here, only when a run
    name was given. `run_id` continues a resumed run's wandb run. WANDB_MODE=offline (files, no network) and
    WANDB_MODE=disabled (nothing at all) are wandb's own switches."""
    import wandb

    try:
        return wandb.init(project=project, name=name, entity=entity, id=run_id, resume="allow" if run_id else None,
                          config=config)
    except getattr(wandb.errors, "Error", RuntimeError) as err:  # no API key, no network, a refused login
        reason = error_reason(err, 200, with_type=False)
        raise ValueError(f"wandb could not start the run {name!r} ({reason}): run `wandb login`, or set "
                         "WANDB_MODE=offline (log to files, sync later) or WANDB_MODE=disabled") from None


def generate_command() -> str:
    """How to call generation from where this process was started: the console script when it was one."""
    return "dalle-generate" if Path(sys.argv[0]).name.startswith("dalle-") else "python generate.py"
