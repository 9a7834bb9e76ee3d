"""The architecture is a contract: layers import downward only (import-linter), and modules stay readable."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "speedladder"
LINT = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")


def lint(src_parent: Path, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([LINT, "--config", str(config)], cwd=src_parent, capture_output=True, text=True,
                          env={"PYTHONPATH": str(src_parent), "PATH": str(Path(sys.executable).parent)},
                          timeout=120, check=False)


@pytest.fixture(scope="module")
def lint_ok() -> None:
    if not Path(LINT).exists():
        pytest.fail("lint-imports is missing: pip install -e '.[test]' installs import-linter")


def test_no_module_imports_upward(lint_ok):
    proc = lint(ROOT / "src", ROOT / "pyproject.toml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 kept, 0 broken" in proc.stdout


def test_the_contract_can_fail(lint_ok, tmp_path):
    """An upward import planted in a copy of the package (the model importing the ladder) breaks the contract."""
    shutil.copytree(SRC, tmp_path / "speedladder", ignore=shutil.ignore_patterns("__pycache__", "assets"))
    model = tmp_path / "speedladder" / "models/gpt.py"
    model.write_text(model.read_text() + "\nfrom speedladder.ladder import climb  # noqa: E402,F401\n")
    proc = lint(tmp_path, ROOT / "pyproject.toml")
    assert proc.returncode != 0 and "BROKEN" in proc.stdout.upper(), proc.stdout[-2000:]
    assert "speedladder.models.gpt -> speedladder.ladder.climb" in proc.stdout


def _long_functions(path: Path, limit: int) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            doc = ast.get_docstring(node) or ""
            # A longer function must say why in its docstring ("Long because ...").
            if length > limit and "long because" not in doc.lower():
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_long_modules_and_functions_are_named():
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 20
    # A long module is named, not refused: a file is split by idea, never to pass a line count.
    for f in files:
        if (n := len(f.read_text().splitlines())) > 400:
            warnings.warn(f"{f.relative_to(ROOT)} is {n} lines: does it hold more than one idea?", stacklevel=1)
    # A long function is named too, never refused: one that reads best whole stays whole.
    for line in (line for f in files for line in _long_functions(f, 60)):
        warnings.warn(f"{line}: a long function; does it read best whole?", stacklevel=1)


def _layers() -> list[list[str]]:
    """The contract's layers, top first, each as the names it holds."""
    from speedladder.codec import tomllib  # the standard library's from 3.11, tomli on 3.10

    layers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
    return [[part.strip() for part in re.split(r"[|:]", layer)] for layer in layers]


def test_every_module_is_in_a_layer():
    """A new module outside the contract would be checked by nothing: every one must be named in a layer."""
    named = {name for layer in _layers() for name in layer}
    modules = {".".join(f.relative_to(ROOT / "src").with_suffix("").parts) for f in SRC.rglob("*.py")
               if f.stem not in ("__init__", "__main__")}
    outside = sorted(m for m in modules if not any(m == n or m.startswith(n + ".") for n in named))
    assert not outside


def test_the_layers_are_few_and_are_folders():
    """At most ten layers, each above the bottom one made of folders (packages), not lists of modules: a folder is
    one concern, and a new module joins its folder's layer by living there (docs/architecture.md#the-layers). Two
    single modules stand beside folders: the Python API and StepSpec, which the records and the rungs both read."""
    layers = _layers()
    assert len(layers) <= 10, len(layers)
    for layer in layers[:-1]:
        for name in layer:
            path = SRC.joinpath(*name.split(".")[1:])
            assert (path / "__init__.py").is_file() or name in ("speedladder.api", "speedladder.spec"), name


# Where one basename in two folders names one idea seen from two sides: a feature's configuration section in
# config/ (config/judge.py is `speedladder judge`'s settings), and the judge's own JSON report.
SHARED_NAMES_ALLOWED = {"judge", "parallel", "report"}


def test_no_two_modules_share_a_name():
    """A basename names one module (or one folder): a reader who sees `gates` or `sweep` knows which is meant."""
    names: dict[str, list[str]] = {}
    for f in SRC.rglob("*.py"):
        if f.stem not in ("__init__", "__main__"):
            names.setdefault(f.stem, []).append(f.relative_to(SRC).as_posix())
    for d in SRC.iterdir():
        if (d / "__init__.py").is_file():
            names.setdefault(d.name, []).append(d.name + "/")
    shared = {n: paths for n, paths in names.items() if len(paths) > 1 and n not in SHARED_NAMES_ALLOWED}
    assert not shared, shared


def test_no_folder_hides_an_api_function():
    """`speedladder.climb`, `.race` and `.apply` are functions: a subpackage of one of those names would replace the
    function on the package the first time anything imported it (hence racing/, ladder/)."""
    import speedladder
    from speedladder import racing  # noqa: F401 -- imported, a subpackage becomes an attribute of the package

    assert all(callable(getattr(speedladder, name)) for name in ("climb", "race", "apply"))
    assert not [n for n in ("climb", "race", "apply") if (SRC / n).exists() or (SRC / f"{n}.py").exists()]


def test_step_spec_is_imported_from_its_module():
    """StepSpec lives in spec.py and is imported from there: a reader of a module is not told it is the rungs'."""
    found = []
    for path in [*SRC.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.ImportFrom) and node.module != "speedladder.spec"
                    and any(a.name == "StepSpec" for a in node.names)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module}")
    assert not found


# A package whose tests live with another folder's, and why (none now).
TESTED_ELSEWHERE: dict[str, str] = {}


def test_tests_mirror_the_packages():
    """tests/ has one folder per package of src/speedladder (the commands run end to end in tests/e2e/), so the tests
    of a module are found where the module is."""
    tests = ROOT / "tests"
    packages = sorted(d.name for d in SRC.iterdir() if (d / "__init__.py").is_file())
    missing = [p for p in packages if not (tests / p).is_dir() and p not in TESTED_ELSEWHERE]
    assert not missing
    assert list((tests / "e2e").glob("test_*.py"))


def test_few_modules_stay_flat():
    """The package's top level holds the entry points and the few modules every layer shares; the rest live in
    folders by concern (docs/architecture.md)."""
    flat = sorted(f.name for f in SRC.glob("*.py"))
    assert len(flat) <= 13, flat


def test_the_old_flat_names_are_gone():
    """Modules live under their folders' names only: no finder answers a name of before, no package hands on its
    modules' names, and meta.py holds the version alone."""
    import importlib

    import speedladder
    from speedladder import meta

    assert [n for n in vars(meta) if not n.startswith("__")] == ["annotations"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", speedladder.__version__)
    for old in ("speedladder.gates", "speedladder.settings", "speedladder.stats", "speedladder.climbing",
                "speedladder.training", "speedladder.workload", "speedladder.gpt",
                "speedladder.results"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    from speedladder import config, measure, verify

    assert not hasattr(config, "RunConfig") and not hasattr(verify, "equivalence")
    assert not hasattr(measure, "time_window")


# A capability's name as a string literal is allowed only where it is something else: a rung's name (the ladders,
# the predictors, the first argument of rung(...) or rung.define(...)), a record's key, an attribute path, transformers' own switch.
CAPABILITY_STRINGS_ELSEWHERE = {
    ("config/ladders.py", "sdpa"), ("config/ladders.py", "pad-vocab"),  # rung names in the ladders
    ("profile/predict.py", "sdpa"), ("profile/predict.py", "pad-vocab"),  # predictors by rung name
    ("models/definition.py", "blocks"),  # results.json's "blocks" key (the record's dotted path)
    ("models/ours.py", "blocks"),  # our GPT's attribute holding its blocks
    ("parallel/rank.py", "blocks"),  # the same attribute, read from a module
    ("models/hf.py", "sdpa"),  # transformers' attn_implementation
}


def test_capabilities_are_named_by_the_enum_alone():
    """No string literal names a capability outside models/capability.py: Requirement and the transform tables use
    the enum (rung names stay strings: the ladder's user-facing names)."""
    from speedladder.models.capability import Capability

    names = {c.value for c in Capability}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "models/capability.py":
            continue
        tree = ast.parse(path.read_text())
        rung_names = {id(node.args[0]) for node in ast.walk(tree) if isinstance(node, ast.Call) and node.args
                      and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("rung", "define")}
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and node.value in names and id(node) not in rung_names
                    and id(node) not in docs and (rel, node.value) not in CAPABILITY_STRINGS_ELSEWHERE):
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not found, "capabilities named by a string, not by Capability: " + ", ".join(found)
