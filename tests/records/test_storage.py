"""records/storage: a saved run names the commit of the speedladder checkout it ran from."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from speedladder.records import storage

ROOT = Path(__file__).parents[2]


def test_a_run_from_a_checkout_names_its_commit():
    if not (ROOT / ".git").exists() or Path(storage.__file__).resolve().parents[2] != ROOT / "src":
        pytest.skip("speedladder is not imported from this git checkout: a run names no commit")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    commit = storage.git_commit()
    assert commit is not None and commit.removesuffix("-dirty") == head
