"""A wheel built from this checkout, installed away from it, trains and generates with the shipped defaults.

As a new user gets it: the wheel is built from the checkout's files (tracked and new, not ignored ones: what a clone
holds) and installed with `pip install --no-deps` into a fresh virtual environment in a temporary folder. That
environment sees this one's installed dependencies through a path file, which adds their folder to sys.path without
running that folder's own path files, so an editable install of dalle_lab there stays out of it: the package, its
default vocabulary and its image tokenizer can only come from the wheel. The console scripts then run from
folders outside the checkout, with PYTHONPATH unset. Nothing is downloaded (no build isolation, --no-index).
"""
import os
import site
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch

import dalle_lab

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["dalle-train", "dalle-generate", "dalle-train-vae", "dalle-align", "dalle-parity", "dalle-bpe", "dalle-quality"]
TINY_MODEL = ["--dim", "32", "--depth", "1", "--heads", "2", "--dim_head", "16", "--warmup_steps", "1",
              "--sample_every_n_steps", "0", "--log_every_n_steps", "1", "--no-progress"]

pytestmark = pytest.mark.skipif(os.environ.get("DALLE_LAB_SLOW_TESTS") != "1",
                                reason="builds and installs a wheel, then trains and generates (~1 min on 2 cores); "
                                       "set DALLE_LAB_SLOW_TESTS=1")


def pip(*args, cwd):
    """This environment's pip, seeing no checkout: PYTHONPATH (set while developing) would show it the source tree."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                            capture_output=True, text=True, cwd=cwd, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def scratch():
    """Module-long folders outside pytest's base temp, which a pytest session started beside this one may prune."""
    with tempfile.TemporaryDirectory(prefix="dalle_lab_wheel_") as directory:
        yield Path(directory)


@pytest.fixture(scope="module")
def wheel(scratch) -> Path:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the wheel is built from the files git would clone")
    source = scratch / "source"
    for name in filter(None, listed.stdout.decode().split("\0")):
        path = ROOT / name
        if path.is_file() and not path.is_symlink():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes(path.read_bytes())
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(scratch / "dist"), str(source), cwd=scratch)
    (built,) = (scratch / "dist").glob("dalle_lab-*.whl")
    return built


@pytest.fixture(scope="module")
def environment(wheel, scratch) -> dict:
    """A fresh venv holding only the wheel (its dependencies: this environment's, read-only); its env variables."""
    venv = scratch / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # the wheel first, into an empty environment: with the path file in place pip would find this environment's
    # dalle_lab (an editable install, say) and call the requirement satisfied
    pip("--python", str(python), "install", "--no-deps", "--no-index", str(wheel), cwd=scratch)
    ours = dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(purelib, "dependencies.pth").write_text("".join(f"{p}\n" for p in ours if Path(p).is_dir()))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1", WANDB_MODE="disabled",
               DALLE_LAB_CACHE=str(venv / "no-cache"))  # a default trained into the cache would not count
    return {"env": env, "bin": venv / "bin", "package": Path(purelib) / "dalle_lab"}


def command(environment, program, *args, cwd):
    """Run the environment's own `program` (its python or a console script, by full path: nothing else on PATH)."""
    result = subprocess.run([str(environment["bin"] / program), *map(str, args)], env=environment["env"], cwd=cwd,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{program}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_the_wheel_holds_the_package_its_data_and_its_metadata(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
        metadata = archive.read(f"{info}/METADATA").decode()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    for shipped in ("assets/bpe/shapes.model", "assets/bpe/emoji.model", "assets/shapes_vqgan.ckpt",
                    "assets/shapes_vqgan.yaml", "assets/emoji_vqgan.ckpt", "assets/shapes_clip/model.safetensors",
                    "cli/train_dalle.py", "extras.py"):
        assert f"dalle_lab/{shipped}" in names, shipped
    assert f"{info}/licenses/LICENSE" in names
    assert not any(n.split("/")[0] in ("tests", "benchmarks", "lab", "bpe", "reports", "scripts") for n in names)
    assert f"Version: {dalle_lab.__version__}\n" in metadata and "License-Expression: MIT" in metadata
    assert "Requires-Python: >=3.10" in metadata
    assert 'Requires-Dist: transformers>=4.40; extra == "align"' in metadata
    for script in SCRIPTS:
        assert f"{script} = dalle_lab.cli:" in entry_points, script


def test_the_installed_wheel_trains_and_generates_with_its_own_defaults(environment, tmp_path):
    package = environment["package"]
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir(), elsewhere.mkdir()
    where = command(environment, "python", "-c", "import dalle_lab; print(dalle_lab.__file__)", cwd=work)
    assert Path(where.strip()) == package / "__init__.py"

    command(environment, "dalle-train", *TINY_MODEL, "--max_steps", "2", "--batch_size", "4", "--output_dir", "run",
            cwd=work)
    checkpoint = torch.load(work / "run" / "dalle.pt", map_location="cpu", weights_only=True)
    assert checkpoint["tokenizer"]["path"] == str(package / "assets" / "bpe" / "shapes.model")
    assert checkpoint["vae"]["model_path"] == str(package / "assets" / "shapes_vqgan.ckpt")
    assert checkpoint["vae"]["config_path"] == str(package / "assets" / "shapes_vqgan.yaml")

    out = command(environment, "dalle-generate", "--dalle_path", work / "run" / "dalle.pt", "--text", "a red circle",
                  "--num_images", "2", "--outputs_dir", "samples", cwd=elsewhere)
    assert "wrote 2 images" in out
    assert sorted(p.name for p in (elsewhere / "samples" / "a_red_circle").glob("*.png")) == ["0.png", "1.png",
                                                                                               "grid.png"]


def test_every_console_script_answers_help(environment, tmp_path):
    for script in SCRIPTS:
        assert "usage:" in command(environment, script, "--help", cwd=tmp_path), script
