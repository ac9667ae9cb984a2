"""Lazy public names for a package's `__init__`: each name is imported from its module on first use, so importing
the package stays light (no torch, taming or deepspeed until a name that needs them is touched)."""
from __future__ import annotations

import sys
from importlib import import_module


def lazy_exports(package: str, names: dict[str, str], extra: tuple[str, ...] = ()):
    """(`__getattr__`, `__dir__`, `__all__`) for the package `package`, resolving each of `names` (public name ->
    module that defines it) on first access and caching it in the package's namespace, so the next access is a
    plain attribute lookup. `extra` joins `__all__` (names the package defines itself)."""
    public = sorted(names) + list(extra)

    def __getattr__(name: str):
        if name in names:
            value = getattr(import_module(names[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return public

    return __getattr__, __dir__, public
