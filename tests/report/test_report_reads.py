"""The reports read typed records: no result is read by string key in src/speedladder/report/.

The rule: a read of a string-literal key, `x["key"]` or `x.get("key", ...)`, is how code reads a results.json-like
dict; the reports read the records of speedladder.records instead (`saved.race.alpha`, not
`saved["race"]["alpha"]`), so a field renamed or retyped is caught by mypy rather than at run time, and the codec
fills what an older file lacks. Found with the syntax tree, so strings inside text, writes (`x["k"] = v`) and list
literals (`["a", "b"]`) are not counted.

Not a result, and so allowed (RECEIVERS below): matplotlib's own tables (`ax.spines[...]`, `rcParams[...]`), a dict
the report builds for itself and reads back (the rung table's display rows), and a mapping of records keyed by
name rather than by field (a sweep point's rungs by rung name). A mapping keyed by data (a profile's categories
by category, its buckets, the matmul facts by precision) is read by a name held in a constant, not a literal.

DEBT would hold what is still read by key, by module, each with its reason: nothing is, now that the model, the
corpus, a rung's timing and explanation, the profile's categories, steps and matmul facts, its predictions and a
tune's candidates and commands are records.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPORT = Path(__file__).resolve().parents[2] / "src" / "speedladder" / "report"

# (module, the receiver as written): why a key read there is not a result read.
RECEIVERS = {
    ("html.py", "row"): "a rung table's display row, built by report/text.rows",
    ("sweep_curve.py", "p.rungs"): "a sweep point's rung records, keyed by rung name",
}
MATPLOTLIB = ("spines", "rcParams", "by_key()")

# Module -> key reads still there, each with its reason (see the docstring): none.
DEBT: dict[str, int] = {}


def key_reads(path: Path) -> list[tuple[int, str]]:
    """Every read of a string-literal key in a module: (line, the receiver as written)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
            found.append((node.lineno, ast.unparse(node.value)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, ast.unparse(node.func.value)))
    return found


def result_reads(path: Path) -> list[str]:
    """The key reads of a module that are not allowed: 'line: receiver'."""
    name = path.relative_to(REPORT).as_posix()
    return [f"{line}: {receiver}" for line, receiver in key_reads(path)
            if (name, receiver) not in RECEIVERS and not receiver.endswith(MATPLOTLIB)]


def test_the_reports_read_records_not_string_keys():
    over = {}
    for path in sorted(REPORT.rglob("*.py")):
        name = path.relative_to(REPORT).as_posix()
        reads = result_reads(path)
        if len(reads) > DEBT.get(name, 0):
            over[name] = reads
    assert not over, f"read a result's field, not its key (see this test's docstring): {over}"


def test_the_check_sees_a_key_read(tmp_path):
    """The rule finds what it is for: a saved dict read by key, subscript and .get alike."""
    planted = tmp_path / "planted.py"
    planted.write_text('def f(saved):\n    return saved["race"]["alpha"], saved.get("sweep")\n'
                       'rows = ["a", "b"]\nax = None\n')
    assert sorted(r for _, r in key_reads(planted)) == ["saved", "saved", "saved['race']"]
