"""`speedladder train`: logs like the source text, falls in loss, samples text, saves a loadable checkpoint."""

from __future__ import annotations

import json
import re

import pytest
import torch

from speedladder.cli import main
from speedladder.config import FULL_LADDER
from speedladder.gpt import GPT
from speedladder.rungs import Env
from speedladder.train import BEST, CHECKPOINT, default_rungs, load_checkpoint

LOG = re.compile(r"^step (\d+), loss (\d+\.\d{3})(?:, val (\d+\.\d{3}))?, time (\d+\.\d)ms, tokens/s ([\d,]+)"
                 r"(?: \(includes compiling\))?$", re.MULTILINE)


def test_train_logs_samples_and_saves_a_checkpoint(tmp_path, capsys):
    rc = main(["train", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,sdpa,pad-vocab,fused-adamw",
               "--steps", "60", "--log-every", "20", "--eval-every", "30", "--sample-tokens", "30",
               "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    logs = LOG.findall(out)
    assert [int(s) for s, *_ in logs] == [20, 30, 40, 60]  # a line at every log step and every evaluation
    assert [v for _, _, v, *_ in logs] == ["", logs[1][2], "", logs[3][2]] and logs[1][2] and logs[3][2]
    assert float(logs[-1][1]) < float(logs[0][1]) and float(logs[3][2]) < float(logs[1][2])  # both losses fall
    best = re.search(r"^best val loss (\d+\.\d{3}) at step (\d+), after (\d+\.\d+) s of training", out, re.MULTILINE)
    assert best and best.group(1) == logs[3][2] and best.group(2) == "60"
    (best_path,) = tmp_path.glob(f"*/{BEST}")
    saved = torch.load(best_path, weights_only=True)
    assert saved["best_step"] == 60 and [s for s, _ in saved["val"]] == [30, 60]
    assert saved["val"][1][1] == pytest.approx(float(logs[3][2]), abs=5e-4) == saved["best_val"]
    assert "sample (30 tokens after the corpus's first 16" in out and "[the time machine" in out
    (path,) = tmp_path.glob(f"*/{CHECKPOINT}")
    ckpt = torch.load(path, weights_only=True)  # plain tensors and values: no pickled code
    assert ckpt["spec"]["transforms"] == ["sdpa", "pad-vocab"] and ckpt["spec"]["optimizer"] == "adamw-fused"
    assert ckpt["tokenizer"] == "char" and len(ckpt["losses"]) == 60
    model, _ = load_checkpoint(path)
    assert isinstance(model, GPT)
    assert model.wte.weight.shape == (28, 32)  # saved under the reference names and shapes, padding dropped
    idx = torch.tensor([[1, 2, 3]])
    assert model.generate(idx, 5, 1.0, 0, torch.Generator().manual_seed(0)).shape == (1, 8)


def test_train_takes_the_winner_of_a_run(tmp_path, capsys):
    rc = main(["run", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,bf16", "--steps", "3",
               "--loss-steps", "5", "--learns-steps", "60", "--no-profile", "--no-process-peak", "--quiet",
               "--out", str(tmp_path / "runs")])
    assert rc == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    fastest = json.loads((run_dir / "results.json").read_text())["fastest"]
    capsys.readouterr()
    assert main(["train", "--run", str(run_dir), "--device", "cpu", "--steps", "10", "--sample-tokens", "0",
                 "--out", str(tmp_path / "ckpt")]) == 0
    out = capsys.readouterr().out
    assert f"with {fastest} from {run_dir}" in out and "step 10, loss" in out and "sample" not in out


def test_the_default_is_the_top_of_the_full_ladder_that_runs_here(monkeypatch):
    cpu = default_rungs(Env("cpu", None, 4))
    assert cpu == tuple(n for n in FULL_LADDER if n not in ("max-autotune", "fp8"))
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())  # Triton and torchao "installed"
    assert default_rungs(Env("cuda", (9, 0), 4)) == FULL_LADDER
    assert default_rungs(Env("cuda", (8, 0), 4)) == FULL_LADDER[:-1]  # fp8 needs compute capability 8.9


@pytest.mark.parametrize("args, message", [
    (["--run", "nowhere"], "no results.json at nowhere"),
    (["--rungs", "eager,max-autotune"], "rung max-autotune cannot run here: needs cuda; this device is cpu"),
    (["--rungs", "eager,warp"], "unknown rung 'warp'"),
    (["--steps", "0"], "--steps and --log-every must be positive"),
])
def test_train_bad_input_is_one_line(args, message, tmp_path, capsys):
    assert main(["train", "--preset", "tiny", "--device", "cpu", "--out", str(tmp_path), *args]
                if args[0] != "--run" else ["train", "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_train_quiet_prints_no_log_lines_but_the_outcome(tmp_path, capsys):
    assert main(["train", "--preset", "tiny", "--device", "cpu", "--rungs", "eager", "--steps", "20",
                 "--log-every", "5", "--sample-tokens", "0", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "step 5, loss" not in out and "training tiny" not in out
    assert out.count("\n") == 3 and "loss " in out and "best val loss" in out and "checkpoint: " in out
    assert main(["train", "--preset", "tiny", "--device", "cpu", "--rungs", "eager", "--steps", "20",
                 "--log-every", "5", "--sample-tokens", "0", "--out", str(tmp_path)]) == 0
    assert len(re.findall(r"^step ", capsys.readouterr().out, re.MULTILINE)) == 4  # without --quiet: every 5 steps
