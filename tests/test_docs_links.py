"""Every relative link in the README, docs/ and lab/ points at a file or folder that exists (files move; links rot)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = ("http://", "https://", "mailto:", "#")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "lab").rglob("*.md"))]


def relative_links(text: str) -> list[str]:
    """Link targets outside fenced code blocks, without their #anchor; external links and pure anchors left out."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return [target.split("#", 1)[0] for target in LINK.findall(prose) if not target.startswith(EXTERNAL)]


def test_the_link_pattern_finds_links_and_images_but_not_external_ones():
    text = ("[a](docs/a.md) ![plot](results/p.png) [b](https://x.org/y) [c](#anchor) [d](t.md#part)\n"
            "```\n[e](inside/code.md)\n```\n")
    assert relative_links(text) == ["docs/a.md", "results/p.png", "t.md"]


def test_every_relative_markdown_link_resolves():
    broken = []
    for path in markdown_files():
        for target in relative_links(path.read_text(encoding="utf-8")):
            if not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "links to missing files:\n" + "\n".join(broken)
