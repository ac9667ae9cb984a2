"""The packages with lazy public names (dalle_lab.lazy): importing them loads no torch, every public name resolves
to the object its module defines and is then a plain attribute, and an unknown name is an AttributeError."""
import subprocess
import sys

import pytest

PACKAGES = ["dalle_lab", "dalle_lab.vae", "dalle_lab.convert"]


@pytest.mark.parametrize("package", PACKAGES)
def test_importing_the_package_loads_no_torch(package):
    code = f"import sys, {package}; assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves_once_and_is_then_an_attribute(package):
    import importlib

    module = importlib.import_module(package)
    names = [name for name in module.__all__ if name != "__version__"]
    assert names and sorted(dir(module)) == sorted(module.__all__)
    for name in names:
        value = getattr(module, name)
        assert vars(module)[name] is value  # cached in the package's namespace: no second import
        assert getattr(importlib.import_module(value.__module__), name) is value


@pytest.mark.parametrize("package", PACKAGES)
def test_an_unknown_name_is_an_attribute_error_naming_the_package(package):
    import importlib

    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'no_such_name'"):
        getattr(importlib.import_module(package), "no_such_name")
