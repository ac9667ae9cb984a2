"""Make dalle-pytorch 1.6.6 importable on current torch without its heavy or broken dependencies, and give its
cached sampler a fair chance. Used only inside the peer's environment; nothing in site-packages is edited.

- `import dalle_pytorch` executes `from taming.models.vqgan import ...`, `import requests`, `from omegaconf import ...`
  and `from pkg_resources import ...` (setuptools >= 81 no longer ships pkg_resources). None of them is used by a
  DALLE that is given image token ids, so they are stubbed. A stub that is touched raises, it never fakes work.
- In 1.6.6 `forward_with_cond_scale` drops the `cache` argument when cond_scale == 1, so `use_cache=True` silently
  recomputes the whole prefix at every step. `repair_cache` binds a version that passes the cache through, on the
  instance only, so the comparison is with the peer's best cached mode.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import types


class _Unavailable:
    """Stand-in for a class the benchmark never builds (VQGAN models): fail loudly if anyone does."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("stubbed in the peer benchmark environment (see lab/perf/peer_shims.py)")


def _stub(name: str, **attrs) -> None:
    if name in sys.modules:
        return
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    module.__file__ = __file__  # so tracebacks point here
    sys.modules[name] = module


def install_stubs() -> None:
    # setuptools >= 81 dropped pkg_resources; older ones still ship it (then the real one is used)
    if "pkg_resources" not in sys.modules and importlib.util.find_spec("pkg_resources") is None:
        _stub("pkg_resources",
              get_distribution=lambda name: types.SimpleNamespace(version=importlib.metadata.version(name)))
    _stub("requests")  # only used to download pretrained VAEs
    _stub("omegaconf", OmegaConf=_Unavailable)
    _stub("taming")
    _stub("taming.models")
    _stub("taming.models.vqgan", VQModel=_Unavailable, GumbelVQ=_Unavailable)


def import_peer():
    """Return the dalle_pytorch package, imported with the stubs in place."""
    install_stubs()
    import dalle_pytorch

    return dalle_pytorch


def repair_cache(dalle) -> None:
    """Let `generate_images(use_cache=True)` really use its key/value cache when cond_scale == 1."""
    unpatched = type(dalle).forward_with_cond_scale

    def forward_with_cond_scale(self, *args, cond_scale=1, cache=None, **kwargs):
        if cond_scale == 1:
            return self(*args, cache=cache, **kwargs)
        return unpatched(self, *args, cond_scale=cond_scale, cache=cache, **kwargs)

    dalle.forward_with_cond_scale = types.MethodType(forward_with_cond_scale, dalle)
