"""examples/research_loop.py on the tiny preset: it keeps the real win (a 3x learning rate) and reverts the rest
(half the learning rate, Muon, a bug that lets attention see the future); a no-op is never kept."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "research_loop.py"


@pytest.mark.slow  # five judgements, each its own process and workers: about 70 s on two cores
def test_the_research_loop_keeps_the_real_win_and_reverts_the_rest(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("research_loop", EXAMPLE)
    assert spec is not None and spec.loader is not None
    loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loop)
    log = loop.main(["--preset", "tiny", "--device", "cpu", "--out", str(tmp_path)])
    assert log[:4] == [("lr-half", "revert"), ("muon", "revert"), ("lr-3x", "keep"), ("no-mask", "revert")]
    # A no-op is reverted once the seeds show it short of 10%; on a loaded machine 8 seeds may not show it (CI at
    # load 3.5: 1.02x, undecided). Kept, it would be a false keep.
    assert log[4][0] == "no-op" and log[4][1] in ("revert", "undecided")
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in printed] == [[name, decision] for name, decision in log]
    assert "broke-causality" in printed[3]
