"""Every lab script imports as a module from the repository root (how lab/README.md says to run them), without
sys.path edits, and every one that takes flags has a main(argv) that answers --help."""
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import lab

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(m.name for m in pkgutil.walk_packages(lab.__path__, "lab.") if not m.ispkg)


def test_the_lab_has_its_studies_and_perf_scripts():
    assert "lab.common" in MODULES and "lab.perf.run" in MODULES and "lab.studies.loss_weighting.run" in MODULES
    assert len(MODULES) > 40


@pytest.mark.parametrize("name", MODULES)
def test_each_lab_module_imports_and_edits_no_import_path(name):
    source = (ROOT / (name.replace(".", "/") + ".py")).read_text(encoding="utf-8")
    assert not re.search(r"sys\.path\s*(\.insert|\[|\.append)", source), f"{name} edits sys.path"
    module = importlib.import_module(name)
    if "argparse" in source and "def main(" in source:
        with pytest.raises(SystemExit) as stop:
            module.main(["--help"])
        assert stop.value.code == 0
