"""The example output in README.md and docs/ is generated from saved results, and cannot drift from the code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_generated_examples_are_current():
    env = {**os.environ, "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(["bash", str(ROOT / "docs" / "examples" / "make.sh"), "--check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_bytes()) <= 15_000


def test_a_file_shown_in_the_docs_is_the_file_itself():
    """A fenced block after `<!-- file: PATH -->` is PATH's whole content (docs/rungs.md shows the rung file the
    tests run)."""
    import re

    shown = 0
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for path, block in re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, flags=re.DOTALL):
            assert block == (ROOT / path).read_text(encoding="utf-8"), f"{page.name} shows {path} as it was"
            shown += 1
    assert shown >= 1
