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
    shutil.copytree(SRC, tmp_path / "speedladder", ignore=shutil.ignore_patterns("__pycache__", "data"))
    model = tmp_path / "speedladder" / "gpt.py"
    model.write_text(model.read_text() + "\nfrom speedladder.climbing import ladder  # noqa: E402,F401\n")
    proc = lint(tmp_path, ROOT / "pyproject.toml")
    assert proc.returncode != 0 and "BROKEN" in proc.stdout.upper(), proc.stdout[-2000:]
    assert "speedladder.gpt -> speedladder.climbing.ladder" in proc.stdout


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


def test_modules_and_functions_stay_short():
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 20
    # A long module is named, not refused: a file is split by idea, never to pass a line count.
    for f in files:
        if (n := len(f.read_text().splitlines())) > 400:
            warnings.warn(f"{f.relative_to(ROOT)} is {n} lines: does it hold more than one idea?", stacklevel=1)
    long_functions = [line for f in files for line in _long_functions(f, 60)]
    assert not long_functions


def test_every_module_is_in_a_layer():
    """A new module outside the contract would be checked by nothing: every one must be named in a layer."""
    from speedladder.config.codec import tomllib  # the standard library's from 3.11, tomli on 3.10

    layers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
    named = {part.strip() for layer in layers for part in layer.split("|")}
    modules = {".".join(f.relative_to(ROOT / "src").with_suffix("").parts) for f in SRC.rglob("*.py")
               if f.stem not in ("__init__", "__main__")}
    outside = sorted(m for m in modules if not any(m == n or m.startswith(n + ".") for n in named))
    assert not outside


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
    for old in ("speedladder.gates", "speedladder.settings", "speedladder.train", "speedladder.stats"):
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
    ("models/base.py", "blocks"),  # results.json's "blocks" key (the record's dotted path)
    ("models/ours.py", "blocks"),  # our GPT's attribute holding its blocks
    ("parallel/worker.py", "blocks"),  # the same attribute, read from a module
    ("models/hf.py", "sdpa"),  # transformers' attn_implementation
}


def test_capabilities_are_named_by_the_enum_alone():
    """No string literal names a capability outside spec.py: Requirement and the transform tables use the
    enum (rung names stay strings: the ladder's user-facing names)."""
    from speedladder.spec import Capability

    names = {c.value for c in Capability}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "spec.py":
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
