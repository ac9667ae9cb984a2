"""Where a number came from: the code's commit, the processor's kind and how busy the machine was.

Every results file the package or the lab writes records these, because the same command gives different numbers
on another commit, on a CPU without native bf16 (oneDNN picks other kernels, and bf16 autocast is emulated there)
or on a machine shared with other jobs (load average above the core count: times stretch, fixed step counts do not).
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the checkout (or site-packages) that holds dalle_lab/


def git_state(directory: Path | str | None = None) -> dict:
    """{"commit", "dirty"} of the git checkout at `directory` (default: the one dalle_lab runs from); both None
    outside a git checkout. `dirty` counts tracked files only: untracked run outputs do not change the code."""
    directory = directory or PACKAGE_ROOT

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def git_commit(directory: Path | str | None = None) -> str | None:
    """The HEAD commit of the checkout at `directory` (default: dalle_lab's), None outside a git checkout."""
    return git_state(directory)["commit"]


def cpu_kind() -> dict:
    """{"model", "avx512_bf16"}: the processor's name and whether it has native bf16 (read from /proc/cpuinfo, so
    no torch import; "avx512_bf16" is None where the flags cannot be read, e.g. off Linux)."""
    model, flags = None, None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:  # the first processor's block: "model name" comes before "flags"
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = value.split()
                    break
    except OSError:
        pass
    return {"model": model or platform.processor() or None,
            "avx512_bf16": None if flags is None else "avx512_bf16" in flags}


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine() -> dict:
    """What a results file records about the machine at the moment of writing."""
    return {"cpu": cpu_kind(), "cpu_count": os.cpu_count(), "load_average": load_average()}


__all__ = ["PACKAGE_ROOT", "cpu_kind", "git_commit", "git_state", "load_average", "machine"]
