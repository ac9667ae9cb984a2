"""Make taming-transformers' model classes importable on current torch / Lightning. One place, on purpose.

Why this exists: `taming.models.vqgan` imports `taming.main` only for its 3-line `instantiate_from_config`, and
`taming/main.py` (the training CLI of taming-transformers-rom1504 0.0.6) imports at module level two things that do
not exist here:

- `torchvision`: not installed on purpose (PyPI's torchvision fails to import beside a CPU torch and then breaks
  pytorch-lightning's import too). taming.main uses it only inside its image-logging callback, which we never run.
- `pytorch_lightning.utilities.distributed.rank_zero_only`: moved to `pytorch_lightning.utilities` in Lightning 2.x.

`import_taming()` puts minimal stand-ins for exactly those two import paths into `sys.modules` *only while taming is
being imported*, then removes them again, so nothing else in the process ever sees a fake torchvision (libraries
that probe for torchvision keep seeing that it is absent). A real, working torchvision or an old Lightning that
still has the module is used as is. Call it before touching any `taming.*` module; it is idempotent and cheap
after the first call.
"""
from __future__ import annotations

import importlib
import sys
import types

_TORCHVISION = "torchvision"
_PL_DISTRIBUTED = "pytorch_lightning.utilities.distributed"


def _importable(name: str) -> bool:
    """True when `name` really imports (a present-but-broken torchvision counts as absent)."""
    try:
        importlib.import_module(name)
        return True
    except Exception:  # noqa: BLE001 - torchvision's failure here is a RuntimeError from its C++ ops
        return False


def _stand_ins() -> dict[str, types.ModuleType]:
    """The modules taming.main needs but this environment lacks, keyed by import path."""
    stand_ins: dict[str, types.ModuleType] = {}
    if not _importable(_TORCHVISION):
        fake = types.ModuleType(_TORCHVISION)
        fake.__doc__ = "stand-in used by dalle_lab.vae.taming_compat while importing taming.main; never used"
        stand_ins[_TORCHVISION] = fake
    if not _importable(_PL_DISTRIBUTED):
        from pytorch_lightning.utilities import rank_zero_only

        fake = types.ModuleType(_PL_DISTRIBUTED)
        fake.rank_zero_only = rank_zero_only
        stand_ins[_PL_DISTRIBUTED] = fake
    return stand_ins


def import_taming():
    """Import and return `taming.models.vqgan` (which holds VQModel and GumbelVQ)."""
    if "taming.models.vqgan" in sys.modules:
        return sys.modules["taming.models.vqgan"]
    try:
        importlib.import_module("taming")
    except ImportError as error:
        raise ImportError(
            "taming-transformers is not installed. Install it with "
            "`pip install --no-deps taming-transformers-rom1504==0.0.6` (scripts/install.sh does this)"
        ) from error

    stand_ins = _stand_ins()
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        return importlib.import_module("taming.models.vqgan")
    finally:
        # Undo: whatever was (or was not) in sys.modules before is restored, so the stand-ins stay private to the
        # modules taming imported them into.
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
