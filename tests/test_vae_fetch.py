"""python -m dalle_lab.vae.fetch: an opt-in download with a progress bar and a sha256 check, tested on local
file:// URLs (nothing here touches the network); and no other module of the package downloads anything."""
import hashlib
import re
from pathlib import Path

import pytest

from dalle_lab.vae import VQGanVAE
from dalle_lab.vae import fetch as fetch_module
from dalle_lab.vae.fetch import FetchError, Published, fetch


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def served(tiny_vqgan):
    """A table entry whose files are a tiny VQGAN behind file:// URLs, its true sha256 expected."""
    ckpt, yaml = tiny_vqgan
    return Published(ckpt_url=ckpt.resolve().as_uri(), yaml_url=yaml.resolve().as_uri(), codes=64, approx_mb=1,
                     sha256=sha256(ckpt), about="a tiny stand-in")


def test_fetch_downloads_checks_the_hash_and_the_files_load(served, tmp_path, capsys):
    ckpt, yaml, digest = fetch("tiny", tmp_path / "vqgan", table={"tiny": served})
    assert (ckpt, yaml) == (tmp_path / "vqgan" / "tiny.ckpt", tmp_path / "vqgan" / "tiny.yaml")
    assert digest == served.sha256 == sha256(ckpt)
    assert VQGanVAE(ckpt, yaml).num_tokens == 64
    assert "tiny.ckpt" in capsys.readouterr().err  # the progress bar names the file
    assert not list((tmp_path / "vqgan").glob(".*.part"))


def test_a_wrong_hash_leaves_nothing_that_looks_complete(served, tmp_path):
    wrong = Published(**{**served.__dict__, "sha256": "0" * 64})
    with pytest.raises(FetchError, match="has sha256 .* not the expected 0000"):
        fetch("tiny", tmp_path, table={"tiny": wrong}, progress=False)
    assert not (tmp_path / "tiny.ckpt").exists() and not list(tmp_path.glob(".*.part"))
    with pytest.raises(FetchError, match="not the expected 1111"):  # --sha256 overrides the table
        fetch("tiny", tmp_path, sha256="1" * 64, table={"tiny": served}, progress=False)
    missing = Published(**{**served.__dict__, "ckpt_url": (tmp_path / "gone.ckpt").as_uri()})
    with pytest.raises(FetchError, match="downloading .*gone.ckpt failed"):
        fetch("tiny", tmp_path, table={"tiny": missing}, progress=False)


def test_the_command_line(served, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(fetch_module.PUBLISHED, "vqgan_imagenet_f16_1024", served)
    assert fetch_module.main(["vqgan_imagenet_f16_1024", "--to", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"sha256 {served.sha256}: matches the expected sha256" in out
    assert f"--vqgan_model_path {tmp_path / 'vqgan_imagenet_f16_1024.ckpt'}" in out
    assert fetch_module.main(["vqgan_imagenet_f16_1024", "--to", str(tmp_path), "--sha256", "2" * 64,
                              "--no-progress"]) == 1
    assert capsys.readouterr().err.count("\n") == 1


def test_the_table_names_both_published_imagenet_vqgans():
    table = fetch_module.PUBLISHED
    assert {name: entry.codes for name, entry in table.items()} == {"vqgan_imagenet_f16_1024": 1024,
                                                                    "vqgan_imagenet_f16_16384": 16384}
    assert all(entry.ckpt_url.startswith("https://heibox.uni-heidelberg.de/") for entry in table.values())


def test_nothing_else_in_the_package_downloads():
    """fetch.py is the one module that may open a URL; importing or training never does."""
    package = Path(fetch_module.__file__).resolve().parents[1]
    network = re.compile(r"urlopen|urlretrieve|import requests|hf_hub_download|snapshot_download|wget ")
    offenders = [str(p.relative_to(package)) for p in package.rglob("*.py")
                 if p.name != "fetch.py" and network.search(p.read_text())]
    assert offenders == []
