"""The Python API: speedladder.climb(model, data=..., ...) climbs as `run` does and leaves the same files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn
from usermodels import write_models

import speedladder
from speedladder.records import Results

GATES = {"loss_steps": 4, "learns_steps": 60}


class TinyLM(nn.Module):
    """forward(x) -> logits; two same-typed blocks in an nn.Sequential."""

    def __init__(self, vocab_size: int = 28) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, 16)
        self.blocks = nn.Sequential(*(nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16), nn.GELU()) for _ in range(2)))
        self.head = nn.Linear(16, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.wte(idx)))


@pytest.mark.slow
def test_climb_in_a_few_lines_writes_what_run_writes(tmp_path, capsys):
    data = tmp_path / "train.bin"
    (np.arange(20_000) % 28).astype(np.uint16).tofile(data)  # a pattern the model can learn in 20 steps
    results = speedladder.climb(TinyLM(), data=str(data), batch_size=4, seq_len=16, rungs=["eager", "bf16", "ckpt"],
                                out=str(tmp_path / "runs"), device="cpu", timing={"steps": 2}, gates=GATES)
    assert isinstance(results, Results) and results.status == "complete"
    assert [r.name for r in results.rungs] == ["eager", "bf16", "ckpt"] and all(r.passed for r in results.rungs)
    (folder,) = (tmp_path / "runs").iterdir()
    for name in ("results.json", "waterfall.png", "report.html"):
        assert (folder / name).stat().st_size > 0
    saved = json.loads((folder / "results.json").read_text())
    assert saved["fastest"] == results.fastest and saved["model"]["convention"] == "logits"
    assert saved["model"]["blocks"] == "blocks" and saved["corpus"]["tokens"] == 20_000
    assert saved["config"]["model_source"].startswith("<python object>")  # an instance: only this process has it
    # The profile runs in a child process, which cannot build an object of this process: it says so, no guess.
    assert "Python object" in saved["profile"]["error"] and not saved.get("predictions")
    assert "fastest rung that passed every gate" in capsys.readouterr().out


@pytest.mark.slow
def test_climb_takes_a_model_file_and_a_factory(tmp_path):
    write_models(tmp_path)
    # lr 3e-3: at 1e-3 this small model ends 60 learns-check steps at the unigram entropy (2.848 against 2.847)
    results = speedladder.climb(f"{tmp_path}/logits_only.py:make_lm", rungs=["eager", "bf16"], device="cpu",
                                preset="tiny", out=str(tmp_path / "a"), quiet=True, timing={"steps": 2}, lr=3e-3,
                                gates=GATES, profile={"enabled": False})
    assert results.model.convention == "logits" and all(r.passed for r in results.rungs)

    def factory(vocab_size: int, seq_len: int) -> nn.Module:
        assert (vocab_size, seq_len) == (28, 32)  # the workload's values
        return TinyLM(vocab_size)

    results = speedladder.climb(factory, rungs=["eager"], device="cpu", preset="tiny", out=str(tmp_path / "b"),
                                quiet=True, timing={"steps": 2}, gates=GATES, profile={"enabled": False})
    assert results.model.source["arguments"] == {"vocab_size": 28, "seq_len": 32}


def test_importing_speedladder_stays_light():
    import subprocess
    import sys

    code = "import sys, speedladder; print('torch' in sys.modules); speedladder.climb; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


def test_a_bad_option_is_a_type_error():
    with pytest.raises(TypeError):
        speedladder.climb(TinyLM(), no_such_option=1)
