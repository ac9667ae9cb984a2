"""The README as a new user reads it: its first screen says what the package is, shows samples, gives exactly the two
quick-start commands and the links onward; its Python snippet runs as written; docs/README.md indexes every page."""
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
FIRST_SCREEN_LINES = 45  # "about 40 lines"


def first_screen() -> str:
    """Everything before the first section after the quick start and its links (## Install)."""
    return README.split("\n## Install", 1)[0]


def test_the_first_screen_says_what_it_is_shows_samples_and_gives_two_commands():
    screen = first_screen()
    lines = screen.splitlines()
    assert len(lines) <= FIRST_SCREEN_LINES, len(lines)
    assert lines[0].startswith("# dalle_lab: ") and len(lines[0]) > len("# dalle_lab: ") + 20  # a title that says it
    assert lines[2].startswith("dalle_lab trains ")  # the sentence of what it is, right under the title
    pictures = re.findall(r'<img src="([^"]+)"', screen) + re.findall(r"!\[[^\]]*\]\(([^)]+)\)", screen)
    assert pictures and all((ROOT / picture).is_file() for picture in pictures)
    assert all((ROOT / p).stat().st_size < 300_000 for p in pictures)  # no large images on the first screen
    quick_start = screen.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick_start.splitlines() if line.startswith("    ")]
    assert commands == ["make demo", "make test"]
    assert "Python 3.11" in quick_start and "runs/dalle/dalle.pt" in quick_start and "manifest.jsonl" in quick_start
    for page in ("docs/own_data.md", "docs/migrating.md", "docs/align.md", "docs/parity.md", "docs/performance.md",
                 "docs/README.md"):
        assert f"]({page})" in screen, page


def test_the_python_snippet_runs_as_written(tmp_path, monkeypatch):
    (snippet,) = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    names: dict = {}
    exec(compile(snippet, "README.md", "exec"), names)  # noqa: S102 - the README's own code
    samples, loss = names["samples"], names["loss"]
    assert samples.shape == (1, 3, 32, 32) and 0 <= samples.min() and samples.max() <= 1
    assert torch.isfinite(loss) and any(p.grad is not None for p in names["dalle"].parameters())  # backward ran


def test_docs_readme_lists_every_page_in_one_line_each():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^- \[([^\]]+)\]\(\1\): \S", index, flags=re.M)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    assert sorted(listed) == pages
