"""What indexing and loading an image-text folder found: counts and names of everything left out, ignored or
converted, each kind one line with its fix. Nothing in a folder is dropped without appearing here."""
from __future__ import annotations

from dataclasses import dataclass, field

_NAMES_SHOWN = 5
# PIL modes that are converted to RGB on loading, and how (transforms.to_rgb)
_CONVERTED = {"L": "grayscale", "1": "black-and-white", "I;16": "16-bit grayscale (scaled to 8 bits)",
              "I;16B": "16-bit grayscale (scaled to 8 bits)", "I;16L": "16-bit grayscale (scaled to 8 bits)",
              "I": "32-bit grayscale (scaled to 8 bits)", "LA": "grayscale with transparency (on white)",
              "RGBA": "transparent (composited on white)", "P": "palette", "PA": "palette with transparency",
              "CMYK": "CMYK", "YCbCr": "YCbCr"}


def names(paths: list[str], shown: int = _NAMES_SHOWN) -> str:
    """The first few paths, and how many more."""
    listed = ", ".join(paths[:shown])
    return listed + (f", ... ({len(paths) - shown} more)" if len(paths) > shown else "")


@dataclass
class FolderReport:
    """Paths are relative to `root`."""

    root: str
    images: int = 0  # usable image-caption pairs
    missing_caption: list[str] = field(default_factory=list)  # images without a .txt
    empty_caption: list[str] = field(default_factory=list)  # .txt without a non-blank line
    corrupt_image: list[str] = field(default_factory=list)  # images PIL could not identify or decode
    corrupt_reason: dict[str, str] = field(default_factory=dict)  # the first error of each, when known
    long_caption: list[str] = field(default_factory=list)  # images left with no caption short enough (skipped)
    long_caption_lines: int = 0  # caption lines longer than text_seq_len, left out (skip_long_captions)
    orphan_captions: list[str] = field(default_factory=list)  # .txt files without an image (ignored)
    blank_lines: list[str] = field(default_factory=list)  # caption files with blank lines between captions
    converted: dict[str, list[str]] = field(default_factory=dict)  # what each non-RGB image kind was converted from

    @property
    def skipped(self) -> int:
        return len(self.missing_caption) + len(self.empty_caption) + len(self.corrupt_image) + len(self.long_caption)

    def count_mode(self, mode: str, key: str) -> None:
        if mode in _CONVERTED:
            self.converted.setdefault(_CONVERTED[mode], []).append(key)

    def problems(self) -> bool:
        """Anything left out or ignored (conversions alone are not problems)."""
        return bool(self.skipped or self.orphan_captions or self.blank_lines or self.long_caption_lines)

    def summary(self) -> str:
        lines = [f"{self.root}: {self.images} usable image-caption pairs, {self.skipped} left out"]
        for paths, what, fix in (
            (self.missing_caption, "image(s) without a caption file, left out",
             "add a same-name .txt (one caption a line) or move the images out"),
            (self.empty_caption, "image(s) whose caption file has no text, left out", "write a caption in each .txt"),
            (self.corrupt_image, "image(s) that cannot be decoded, left out",
             "re-save them with an image editor or delete them" + self._first_reason()),
            (self.long_caption, "image(s) with every caption longer than text_seq_len, left out",
             "raise --text_seq_len (or --text_seq_len auto)"),
            (self.orphan_captions, "caption file(s) without an image, ignored",
             "add the image with the same name, or delete the .txt"),
            (self.blank_lines, "caption file(s) with blank lines, which are ignored", "nothing to do"),
        ):
            if paths:
                lines.append(f"  {len(paths)} {what} ({names(paths)}): {fix}")
        if self.long_caption_lines:
            lines.append(f"  {self.long_caption_lines} caption line(s) longer than text_seq_len, left out "
                         "(--skip_long_captions)")
        for kind, paths in sorted(self.converted.items()):
            lines.append(f"  {len(paths)} {kind} image(s) converted to RGB ({names(paths)})")
        return "\n".join(lines)

    def brief(self) -> str:
        """The problems in one line: counts with the first names."""
        parts = [f"{len(paths)} {what} ({names(paths, 3)})" for paths, what in (
            (self.missing_caption, "image(s) without a caption file"), (self.empty_caption, "with an empty caption file"),
            (self.corrupt_image, "that cannot be decoded"), (self.long_caption, "with every caption too long"))
            if paths]
        return "; ".join(parts) or "no problems found"

    def _first_reason(self) -> str:
        if not self.corrupt_reason:
            return ""
        key = self.corrupt_image[0] if self.corrupt_image[0] in self.corrupt_reason else next(iter(self.corrupt_reason))
        return f" ({key}: {self.corrupt_reason[key][:120]})"
