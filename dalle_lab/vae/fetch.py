"""Download a published taming-transformers VQGAN once, on request: the only code in dalle_lab that touches the
network, and only when a user runs it.

    python -m dalle_lab.vae.fetch vqgan_imagenet_f16_1024 --to vqgan/
    python -m dalle_lab.vae.fetch vqgan_imagenet_f16_16384 --to vqgan/ --sha256 HEX   # check against a hash you trust

It writes DIR/NAME.ckpt and DIR/NAME.yaml (each downloaded to a temporary name, then renamed: an interrupted
download leaves nothing that looks complete), shows a progress bar, and checks the checkpoint's sha256 against the
table below or --sha256. Then: train_dalle.py --vqgan_model_path DIR/NAME.ckpt --vqgan_config_path DIR/NAME.yaml.

The table (where each figure comes from, docs/own_data.md): the checkpoints and their reconstruction FIDs are the
ones taming-transformers' README lists ("Overview of pretrained models"); the per-file download links are the
ones DALLE-pytorch's vae.py uses for f16-1024 and that the taming community's download scripts use for f16-16384;
the sizes are those noted in nerdyrodent/VQGAN-CLIP's download_models.sh (958 MB, 980 MB). No sha256 of either file
is published by the authors or found in any public source we searched, so the table holds none: the hash of what
was downloaded is printed, and every DALLE checkpoint trained with it records it (a different file is refused).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from dalle_lab.utils import file_sha256


@dataclass(frozen=True)
class Published:
    ckpt_url: str
    yaml_url: str
    codes: int
    approx_mb: int  # the size a download should be near (from the source named in the module docstring)
    sha256: str | None  # None: not published (see the module docstring)
    about: str


PUBLISHED = {
    "vqgan_imagenet_f16_1024": Published(
        ckpt_url="https://heibox.uni-heidelberg.de/f/140747ba53464f49b476/?dl=1",
        yaml_url="https://heibox.uni-heidelberg.de/f/6ecf2af6c658432c8298/?dl=1",
        codes=1024, approx_mb=958, sha256=None,
        about="ImageNet, 256 px -> 16x16 grid of 1024 codes, reconstruction FID 8.0 (DALLE-pytorch's --taming VQGAN)"),
    "vqgan_imagenet_f16_16384": Published(
        ckpt_url="https://heibox.uni-heidelberg.de/f/867b05fc8c4841768640/?dl=1",
        yaml_url="https://heibox.uni-heidelberg.de/f/274fb24ed38341bfa753/?dl=1",
        codes=16384, approx_mb=980, sha256=None,
        about="ImageNet, 256 px -> 16x16 grid of 16384 codes, reconstruction FID 4.9"),
}
_CHUNK = 1 << 20


class FetchError(RuntimeError):
    """A download that failed or does not match what was expected; nothing is left at the final path."""


def fetch(name: str, to: str | os.PathLike, sha256: str | None = None, progress: bool = True,
          table: dict[str, Published] | None = None) -> tuple[Path, Path, str]:
    """Download `name` into directory `to`; returns (ckpt path, yaml path, the checkpoint's sha256). `sha256`
    overrides the table's expected hash. An existing file whose hash matches is kept, not downloaded again."""
    table = PUBLISHED if table is None else table
    if name not in table:
        raise FetchError(f"unknown VQGAN {name!r}: choose one of {', '.join(table)}")
    entry = table[name]
    expected = (sha256 or entry.sha256 or "").lower() or None
    directory = Path(to).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    ckpt, yaml = directory / f"{name}.ckpt", directory / f"{name}.yaml"
    if ckpt.is_file() and expected and file_sha256(ckpt) == expected and yaml.is_file():
        return ckpt, yaml, expected
    _download(entry.yaml_url, yaml, None, progress=False)
    digest = _download(entry.ckpt_url, ckpt, expected, progress, approx_bytes=entry.approx_mb * 10**6)
    return ckpt, yaml, digest


def _download(url: str, target: Path, expected: str | None, progress: bool, approx_bytes: int | None = None) -> str:
    """Stream `url` to a temporary file beside `target`, hashing as it goes; rename it into place only when the
    hash matches `expected` (or nothing was expected). Returns the sha256."""
    from tqdm import tqdm

    partial = target.with_name(f".{target.name}.part")
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url) as response, open(partial, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or approx_bytes
            with tqdm(total=total, unit="B", unit_scale=True, desc=target.name, disable=not progress,
                      file=sys.stderr) as bar:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
    except OSError as error:  # URLError and HTTPError are OSErrors
        partial.unlink(missing_ok=True)
        raise FetchError(f"downloading {url} failed ({error}); nothing was written to {target}") from error
    found = digest.hexdigest()
    if expected and found != expected:
        partial.unlink(missing_ok=True)
        raise FetchError(f"{url} has sha256 {found}, not the expected {expected}: the download is damaged or the "
                         f"file changed upstream; nothing was written to {target}")
    os.replace(partial, target)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dalle_lab.vae.fetch", description=__doc__.split("\n\n")[0],
                                     epilog="\n".join(f"{name}: {p.about}, about {p.approx_mb} MB"
                                                      for name, p in PUBLISHED.items()),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(PUBLISHED), help="which published VQGAN")
    parser.add_argument("--to", required=True, help="directory to write NAME.ckpt and NAME.yaml into")
    parser.add_argument("--sha256", default=None, help="the checkpoint's expected sha256 (refused if it differs)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        ckpt, yaml, digest = fetch(args.name, args.to, args.sha256, args.progress)
    except FetchError as error:
        print(f"fetch: error: {error}", file=sys.stderr)
        return 1
    entry = PUBLISHED[args.name]
    checked = "matches the expected sha256" if (args.sha256 or entry.sha256) else \
        "no published sha256 to check it against (recorded in every checkpoint trained with it)"
    print(f"wrote {ckpt} ({ckpt.stat().st_size / 1e6:.0f} MB, sha256 {digest}: {checked}) and {yaml}")
    print(f"use it: python train_dalle.py ... --vqgan_model_path {ckpt} --vqgan_config_path {yaml}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
