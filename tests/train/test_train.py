"""`speedladder train`: logs like the source text, falls in loss, samples text, saves a loadable checkpoint, and
`--resume` continues a killed run to the loss curve it would have had."""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import cli, only_folder
from torch import nn

from speedladder import rungs
from speedladder.cli import main
from speedladder.data.batches import BatchStream
from speedladder.models.gpt import GPT
from speedladder.rungs import compose
from speedladder.train.trainer import BEST, CHECKPOINT, NO_CONFIGURATION, load_checkpoint

LOG = re.compile(r"^step (\d+), loss (\d+\.\d{3})(?:, val (\d+\.\d{3}))?, time (\d+\.\d)ms, tokens/s ([\d,]+)"
                 r"(?: \(includes compiling\))?$", re.MULTILINE)


def test_train_logs_samples_and_saves_a_checkpoint(tmp_path, capsys):
    rc = main(["train", "--preset", "tiny", "--device", "cpu", "--compose", "eager,sdpa,pad-vocab,fused-adamw",
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


@pytest.mark.slow
def test_train_takes_the_winner_of_a_run(tmp_path, capsys):
    rc = main(["run", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,bf16", "--window-steps", "3",
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


def test_with_no_configuration_named_train_trains_eager_and_says_how_to_train_a_measured_one(tmp_path, capsys):
    """Never an unmeasured composition: with neither --run, --config nor --compose, eager, with a one-line hint."""
    assert main(["train", "--preset", "tiny", "--device", "cpu", "--steps", "10", "--sample-tokens", "0",
                 "--eval-every", "0", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert NO_CONFIGURATION in out and "speedladder train --run RUN_DIR" in out
    assert " with eager: " in out and ", fp32, eager, adamw, on cpu" in out
    (path,) = tmp_path.glob(f"*/{CHECKPOINT}")
    spec = torch.load(path, weights_only=True)["spec"]
    assert not spec["compile"] and spec["autocast"] is None and spec["transforms"] == []


def test_a_run_whose_fastest_is_eager_trains_eager_and_says_so(tmp_path, capsys):
    assert main(["run", "--preset", "tiny", "--device", "cpu", "--rungs", "eager", "--window-steps", "2",
                 "--learns-steps", "0", "--no-profile", "--no-process-peak", "--quiet",
                 "--out", str(tmp_path / "runs")]) == 0
    run_dir = only_folder(tmp_path / "runs")
    capsys.readouterr()
    assert main(["train", "--run", str(run_dir), "--device", "cpu", "--steps", "10", "--sample-tokens", "0",
                 "--eval-every", "0", "--out", str(tmp_path / "ckpt")]) == 0
    out = capsys.readouterr().out
    assert f"with eager from {run_dir} (nothing there paid: its fastest is eager)" in out
    assert NO_CONFIGURATION not in out


@pytest.mark.parametrize("args, message", [
    (["--run", "nowhere"], "no results.json at nowhere"),
    (["--compose", "eager,max-autotune"], "rung max-autotune cannot run here: needs cuda; this device is cpu"),
    (["--compose", "eager,warp"], "unknown rung 'warp'"),
    (["--steps", "0"], "--steps and --log-every must be positive"),
])
def test_train_bad_input_is_one_line(args, message, tmp_path, capsys):
    assert main(["train", "--preset", "tiny", "--device", "cpu", "--out", str(tmp_path), *args]
                if args[0] != "--run" else ["train", "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_train_quiet_prints_no_log_lines_but_the_outcome(tmp_path, capsys):
    assert main(["train", "--preset", "tiny", "--device", "cpu", "--compose", "eager", "--steps", "20",
                 "--log-every", "5", "--sample-tokens", "0", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "step 5, loss" not in out and "training tiny" not in out
    assert out.count("\n") == 3 and "loss " in out and "best val loss" in out and "checkpoint: " in out
    assert main(["train", "--preset", "tiny", "--device", "cpu", "--compose", "eager", "--steps", "20",
                 "--log-every", "5", "--sample-tokens", "0", "--out", str(tmp_path)]) == 0
    assert len(re.findall(r"^step ", capsys.readouterr().out, re.MULTILINE)) == 4  # without --quiet: every 5 steps


# -- checkpoints and --resume ----------------------------------------------------------------------

@pytest.fixture
def logit_gain():
    """An architecture rung whose transform makes a parameter of its own: a learned gain after the final norm."""
    class Gain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gain = nn.Parameter(torch.ones(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.gain

    def gain(model: nn.Module) -> nn.Module:
        model.ln_f = nn.Sequential(model.ln_f, Gain())
        return model

    rungs.rung.define("logit-gain", "a learned gain on the final norm", "architecture", model=gain)
    yield
    rungs.unregister("logit-gain")


@pytest.mark.parametrize("names", [("pad-vocab", "logit-gain"), ("muon",)])
def test_a_restored_step_trains_on_as_the_one_it_was_saved_from(tiny, logit_gain, names):
    """Padding rows and a transform's own parameter (beyond the reference state), and Muon's and AdamW's states,
    through a checkpoint's round trip: the next steps are the same, bit for bit."""
    spec = compose(names, tiny.base_spec, tiny.env)
    step, stream = tiny.step(spec), tiny.stream(spec)
    for _ in range(5):
        step(*next(stream))
    buffer = io.BytesIO()
    torch.save({"model": step.reference_state(), "beyond": step.beyond_reference(),
                "optimizer": step.optimizer.state_dict(), "stream": stream.state()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert ("wte.weight" in saved["beyond"]) == ("pad-vocab" in names)
    assert ("ln_f.1.gain" in saved["beyond"]) == ("logit-gain" in names)
    again, other = tiny.step(spec), tiny.stream(spec)
    again.restore(saved["model"], saved["beyond"], saved["optimizer"])
    other.load_state(saved["stream"])
    for _ in range(3):
        assert torch.equal(step(*next(stream)), again(*next(other)))
    assert all(torch.equal(p, again.params[n]) for n, p in step.params.items())


# 100 steps, a line each: more output than a 4096-byte pipe holds, so a run whose stdout nobody reads blocks on a
# log line part-way through and cannot finish before it is killed.
RESUMABLE = ["--preset", "tiny", "--device", "cpu", "--compose", "eager,pad-vocab", "--steps", "100",
             "--log-every", "1", "--eval-every", "30", "--save-every", "10", "--sample-tokens", "0"]


def _train_in_child(args: list[str], code: str | None = None, **popen) -> subprocess.Popen:
    """`python -m speedladder train ARGS` in a process of its own (or `code` given the same argv), one thread."""
    cmd = [sys.executable, *(["-c", code] if code else ["-m", "speedladder"]), "train", *args]
    return subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, **popen)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The checkpoint of the run the interrupted ones must end as: RESUMABLE, never stopped."""
    out = tmp_path_factory.mktemp("uninterrupted")
    rc, _, err = cli("train", *RESUMABLE, "--out", str(out))
    assert rc == 0, err
    return torch.load(only_folder(out) / CHECKPOINT, weights_only=True)


def _same_run(resumed: dict, uninterrupted: dict) -> None:
    """Step for step the same losses, the same val curve and best, the same final weights: exact, fp32 eager on
    one thread computes the same numbers in the same order."""
    assert resumed["step"] == uninterrupted["step"] == 100 and len(resumed["losses"]) == 100
    assert resumed["losses"] == uninterrupted["losses"]
    assert resumed["val"] == uninterrupted["val"] and resumed["best_step"] == uninterrupted["best_step"]
    assert resumed["model"].keys() == uninterrupted["model"].keys()
    assert all(torch.equal(resumed["model"][k], uninterrupted["model"][k]) for k in resumed["model"])


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(fcntl, "F_SETPIPE_SZ"), reason="needs a pipe of a set size (Linux)")
def test_a_run_killed_mid_run_resumes_to_the_same_loss_curve(tmp_path, uninterrupted):
    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 4096)  # the smallest pipe: the child blocks once it is full
    child = _train_in_child([*RESUMABLE, "--out", str(tmp_path)], stdout=write, stderr=subprocess.DEVNULL)
    os.close(write)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(f"*/{CHECKPOINT}")):  # renamed into place: whole
            assert child.poll() is None and time.monotonic() < deadline, "no checkpoint before the child ended"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        child.kill()
        os.close(read)
    run_dir = only_folder(tmp_path)
    killed = torch.load(run_dir / CHECKPOINT, weights_only=True)
    assert killed["step"] % 10 == 0 and 10 <= killed["step"] < 100, killed["step"]  # mid-run
    rc, out, err = cli("train", "--resume", str(run_dir))  # the saved configuration: no other flag needed
    assert rc == 0, err
    assert f"resuming {run_dir} at step {killed['step']} of 100, from its checkpoint of " in out
    first = int(LOG.findall(out)[0][0])
    assert first == killed["step"] + 1  # the next step is the first logged: nothing trained twice
    _same_run(torch.load(run_dir / CHECKPOINT, weights_only=True), uninterrupted)
    assert list(run_dir.iterdir()) and not list(run_dir.glob("*.tmp"))


# Run in the child: the real command, killed between writing its second checkpoint and renaming it into place.
KILL_IN_SAVE = """
import os, signal, sys
from speedladder.cli import main
real, renames = os.replace, []
def replace(src, dst):
    renames.append(str(dst))
    if str(dst).endswith("checkpoint.pt") and renames.count(str(dst)) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    real(src, dst)
os.replace = replace
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_kill_during_a_save_leaves_the_previous_checkpoint(tmp_path, uninterrupted):
    child = _train_in_child([*RESUMABLE, "--quiet", "--out", str(tmp_path)], KILL_IN_SAVE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert child.wait(120) == -signal.SIGKILL
    run_dir = only_folder(tmp_path)
    assert (run_dir / f"{CHECKPOINT}.tmp").is_file()  # the second save, written but never renamed
    previous = torch.load(run_dir / CHECKPOINT, weights_only=True)
    assert previous["step"] == 10 and len(previous["losses"]) == 10
    model, _ = load_checkpoint(run_dir / CHECKPOINT)  # whole, and loadable as every checkpoint is
    assert isinstance(model, GPT)
    rc, _, err = cli("train", "--resume", str(run_dir), "--quiet")
    assert rc == 0, err
    _same_run(torch.load(run_dir / CHECKPOINT, weights_only=True), uninterrupted)


@pytest.fixture
def stopped(tmp_path, monkeypatch) -> Path:
    """A run folder whose training stopped (Ctrl-C) at step 15 of 30, its checkpoint at step 10."""
    real = BatchStream.__next__

    def next_batch(stream: BatchStream):
        if stream.drawn == 15:
            raise KeyboardInterrupt
        return real(stream)

    monkeypatch.setattr(BatchStream, "__next__", next_batch)
    rc, _, err = cli("train", "--preset", "tiny", "--device", "cpu", "--compose", "eager", "--steps", "30",
                     "--save-every", "10", "--sample-tokens", "0", "--quiet", "--out", str(tmp_path / "runs"))
    monkeypatch.setattr(BatchStream, "__next__", real)
    assert rc == 130 and "interrupted" in err
    run_dir = only_folder(tmp_path / "runs")
    assert torch.load(run_dir / CHECKPOINT, weights_only=True)["step"] == 10
    return run_dir


@pytest.mark.parametrize("flags, message", [
    (["--lr", "0.002"], "was trained with run.lr = 0.001, not 0.002: a run resumes with the configuration"),
    (["--compose", "eager,sdpa"], "was trained with train.rungs = eager, not eager,sdpa"),
    (["--steps", "40"], "was trained with train.steps = 30, not 40"),
    (["--batch-size", "8"], "was trained with run.batch_size = 4, not 8"),
])
def test_resume_refuses_another_configuration_in_one_line(stopped, flags, message):
    rc, _, err = cli("train", "--resume", str(stopped), *flags)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert torch.load(stopped / CHECKPOINT, weights_only=True)["step"] == 10  # nothing saved is touched


def test_resume_may_change_how_it_logs_saves_and_samples(stopped):
    rc, out, err = cli("train", "--resume", str(stopped), "--log-every", "5", "--save-every", "0",
                       "--sample-tokens", "10")
    assert rc == 0, err
    assert [int(s) for s, *_ in LOG.findall(out)] == [15, 20, 25, 30] and "sample (10 tokens" in out
    assert torch.load(stopped / CHECKPOINT, weights_only=True)["step"] == 30


def test_resume_refuses_no_checkpoint_a_finished_run_and_an_old_checkpoint(stopped, tmp_path):
    cases = [(tmp_path / "empty", f"no {CHECKPOINT} in {tmp_path / 'empty'}: nothing to resume")]
    (tmp_path / "empty").mkdir()
    old = tmp_path / "old"  # a checkpoint of an earlier release: weights and losses, nothing to continue from
    old.mkdir()
    ckpt = torch.load(stopped / CHECKPOINT, weights_only=True)
    torch.save({k: v for k, v in ckpt.items() if k not in ("resume", "step")}, old / CHECKPOINT)
    cases.append((old, "holds no optimizer state or batch position to continue from"))
    assert cli("train", "--resume", str(stopped), "--quiet")[0] == 0
    cases.append((stopped, f"{stopped} has finished: its checkpoint is at step 30 of 30"))
    for folder, message in cases:
        rc, _, err = cli("train", "--resume", str(folder))
        assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
