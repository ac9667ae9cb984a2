"""Small helpers shared across the package: device choice, file identity, atomic writes.

Kept dependency-light (torch is imported lazily) so `import dalle_lab` stays fast.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def pick_device(name: str = "auto"):
    """Resolve a device name: "auto" picks CUDA when present, else CPU. Anything torch accepts passes through."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available here; use --device cpu or auto")
    return device


def file_sha256(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes: the identity checkpoints record for tokenizers and image tokenizers."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write(path: str | os.PathLike, write: Callable[[str], Any]) -> Path:
    """Call `write(tmp_path)`, then rename tmp_path over `path`.

    The rename is atomic on POSIX, so a process killed mid-write leaves the previous file intact.
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
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    """torch.save through a temporary file and a rename (see atomic_write)."""
    import torch

    return atomic_write(path, lambda tmp: torch.save(obj, tmp))
