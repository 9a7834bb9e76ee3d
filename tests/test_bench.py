"""Part 11: bench/gpu.sh runs end to end in its CPU smoke mode."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
def test_gpu_script_smoke_mode(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for ladder in ("small", "gpt2"):
        (path,) = (tmp_path / ladder).glob("*/results.json")
        res = json.loads(path.read_text())
        assert res["status"] == "complete"
        assert (path.parent / "waterfall.png").exists()
        assert (tmp_path / ladder / "log.txt").read_text()
    gpt2 = json.loads(next((tmp_path / "gpt2").glob("*/results.json")).read_text())
    assert gpt2["corpus"] == {"source": "tinyshakespeare", "tokenizer": "gpt2", "tokens": 338_025,
                              "vocab_size": 50257, "train_tokens": 304_223, "val_tokens": 33_802,
                              "val_from": "the last 10% of tinyshakespeare"}
    # The short table comes last.
    tail = proc.stdout.strip().splitlines()[-12:]
    assert any(line.startswith("eager") for line in tail)
