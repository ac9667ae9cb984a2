"""Create the separate virtual environment that holds the peer, dalle-pytorch 1.6.6 from PyPI.

Why a separate environment: the peer's published requirements pull torchvision (which cannot import beside the CPU
torch wheel) and, without a constraint, a CUDA torch of several GB. So the peer is installed with --no-deps, next to
the same torch version our environment runs, plus only the small packages that its `import dalle_pytorch` really
executes. The modules it imports but never uses for a DALLE on token ids (taming, omegaconf, requests, pkg_resources)
are stubbed at import time by peer_shims.py instead of installed.

Pins: the two helper packages are pinned to releases of the peer's own era so that its code runs as its users ran it.
"""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

PEER_VENV = Path(__file__).resolve().parent / ".peer-venv"
PEER_PACKAGE = "dalle-pytorch==1.6.6"
PEER_NEEDS = [
    "einops",
    "rotary-embedding-torch==0.1.5",
    "axial-positional-embedding==0.2.1",
    "numpy",
    "pillow",
    "pyyaml",
    "tqdm",
    "packaging",
    # dalle_pytorch.tokenizer's own needs (its SimpleTokenizer is the reference for dalle_lab's; the convert tests)
    "ftfy",
    "regex",
    "tokenizers",
]
_MARKER = "dalle_lab-peer-ready.txt"  # written last, so a half-built environment is rebuilt next time


def peer_python(venv: Path = PEER_VENV) -> Path:
    return venv / "bin" / "python"


def _pip(python: Path, *args: str) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    print("[peer-env] pip install", " ".join(args), flush=True)
    subprocess.run(cmd, check=True)


def ensure_peer_venv(venv: Path = PEER_VENV) -> Path:
    """Return the peer environment's python, building the environment first when it is missing or incomplete."""
    python = peer_python(venv)
    marker = venv / _MARKER
    torch_version = importlib.metadata.version("torch")  # the torch our own environment runs
    if marker.exists() and marker.read_text().strip() == torch_version:
        return python

    if not python.exists():
        print(f"[peer-env] creating {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    constraints = venv / "torch-constraint.txt"
    constraints.write_text(f"torch=={torch_version}\n")
    # A local CPU wheel of this exact version is what pip finds first here; the constraint keeps every later
    # install from swapping it for another build.
    _pip(python, "-c", str(constraints), f"torch=={torch_version}")
    _pip(python, "-c", str(constraints), "--no-deps", PEER_PACKAGE)
    print("[peer-env] pip will list requirements of dalle-pytorch that are not installed: that is on purpose "
          "(torchvision, CUDA torch, taming, ...), see the top of lab/perf/peer_env.py", flush=True)
    _pip(python, "-c", str(constraints), *PEER_NEEDS)
    check = subprocess.run(
        [str(python), "-c", "from lab.perf import peer_shims; peer_shims.import_peer()"],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2],  # the repository root: `lab` imports
    )
    if check.returncode != 0:
        raise RuntimeError(
            f"the peer environment {venv} was built but `import dalle_pytorch` fails:\n{check.stderr}\n"
            f"Delete {venv} and run again; if it persists, the pins in {__file__} need updating."
        )
    marker.write_text(torch_version + "\n")
    return python


if __name__ == "__main__":
    print(ensure_peer_venv())
