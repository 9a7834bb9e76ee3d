"""Parts 1 and 10: the command line, its help, and bad input (one line, exit 2, no traceback)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from speedladder.cli import build_parser, main


def test_every_flag_is_documented_with_its_default(capsys):
    parser = build_parser()
    for command in ("run", "report"):
        with pytest.raises(SystemExit) as e:
            main([command, "--help"])
        assert e.value.code == 0
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.dest == "help" or not action.option_strings:
                continue
            assert action.help, f"{name} {action.option_strings} has no help"
            if action.const is None and action.nargs != 0:  # a flag that takes a value
                assert "Default" in action.help, f"{name} {action.option_strings[0]} does not say its default"


def test_help_shows_the_dataclass_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Default: eager,compile,bf16,batch,ckpt" in text
    assert "Default: 0.001" in text  # AdamW lr, from RunConfig
    assert "Default: 300" in text  # learns-check steps, from GateConfig
    assert "d2l-512 (B=64, T=128, timemachine)" in text


@pytest.mark.parametrize("args, message", [
    (["--preset", "nope"], "invalid choice: 'nope'"),
    (["--rungs", "eager,warp"], "unknown rung 'warp'"),
    (["--rungs", "compile,eager"], "eager is the baseline"),
    (["--batch-size", "0"], "batch size must be positive, got 0"),
    (["--seq-len", "-4"], "sequence length must be positive, got -4"),
    (["--window-steps", "-1"], "steps per window must be positive"),
    (["--windows", "2"], "at least 3 timed windows"),
    (["--batch-size", "many"], "invalid int value: 'many'"),
    (["--seq-len", "4096"], "exceeds preset tiny's context of 32"),
    (["--data", "no/such/file.txt"], "data file not found: no/such/file.txt"),
    (["--batch-size", "6000"], "is more than the corpus timemachine holds"),
    (["--device", "cuda:7"], "cuda"),
    (["--tokenizer", "bytes"], "invalid choice: 'bytes'"),
    (["--lr", "nan"], "learning rate must be positive, got nan"),
    (["--lr", "inf"], "learning rate must be positive, got inf"),
    (["--peak-tflops", "989"], "give the peak per precision"),
    (["--peak-tflops", "bf17=3"], "unknown precision 'bf17'"),
    (["--learns-band", "nan"], "learns-check band must be zero or more, got nan"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    try:
        rc = main(["run", "--preset", "tiny", "--out", str(tmp_path), *args] if args[0] != "--preset"
                  else ["run", "--out", str(tmp_path), *args])
    except SystemExit as e:  # argparse's own checks exit from inside parse_args
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert not list(tmp_path.iterdir())  # nothing half-made is left behind


def test_bad_data_files_are_one_line(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    binary = tmp_path / "binary.dat"  # .bin means a token file (tests/fixtures/test_user_data.py)
    binary.write_bytes(bytes(range(128, 256)))
    for path, message in ((empty, "is empty"), (binary, "is not UTF-8 text")):
        assert main(["run", "--preset", "tiny", "--data", str(path), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


def test_report_redraws_from_the_saved_file_alone(tmp_path, capsys):
    assert main(["run", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,bf16", "--window-steps", "2",
                 "--no-profile", "--loss-steps", "4", "--learns-steps", "60", "--no-process-peak", "--quiet",
                 "--out", str(tmp_path / "runs")]) == 0
    first = capsys.readouterr().out
    (run,) = (tmp_path / "runs").iterdir()
    moved = tmp_path / "copy"
    moved.mkdir()
    shutil.copy(run / "results.json", moved / "results.json")
    assert main(["report", str(moved)]) == 0
    again = capsys.readouterr().out
    assert (moved / "waterfall.png").stat().st_size > 10_000
    table = lambda text: [ln for ln in text.splitlines() if "│" in ln]
    assert table(first) and table(first) == table(again)


@pytest.mark.parametrize("command, args, says", [
    # A flag that cannot change what the command does: one line naming the flag, the command and whose it is.
    (["profile"], ["--stack-all"], "--stack-all does not apply to profile (a flag of run, race)"),
    (["profile"], ["--batch-lr-scale", "sqrt"], ("--batch-lr-scale does not apply to profile (a flag of run, tune, "
                                                 "race, train, sweep, judge)")),
    (["profile"], ["--window-steps", "3"], "--window-steps does not apply to profile"),
    (["predict"], ["--stack-all"], "--stack-all does not apply to predict"),
    (["predict"], ["--batch-lr-scale=sqrt"], "--batch-lr-scale does not apply to predict"),
    (["predict"], ["--ladder", "full"], "--ladder does not apply to predict"),
    (["ddp"], ["--beside", "ckpt"], "--beside does not apply to ddp"),
    (["tune"], ["--rung-file", "x.py"], "--rung-file does not apply to tune"),
    (["run"], ["--val-sequences", "8"], "--val-sequences does not apply to run (a flag of tune, race, train, judge)"),
    (["report", "x"], ["--rungs", "eager"], "--rungs does not apply to report"),
    (["compare", "x", "y"], ["--quiet"], "--quiet does not apply to compare"),
    # A spelling that now belongs to another command names this command's own.
    (["run"], ["--steps", "2"], "--steps does not apply to run (it is train's); run's is --window-steps"),
    (["predict"], ["--nproc", "2"], "--nproc does not apply to predict (it is ddp's); predict's is --nprocs"),
    (["ddp"], ["--nprocs", "2,4"], "--nprocs does not apply to ddp (it is predict's)"),
    (["race"], ["--eval-every", "5"], ("--eval-every does not apply to race (it is train's); race's is "
                                       "--eval-every-base-steps")),
    (["train"], ["--rungs", "eager"], ("--rungs does not apply to train (a flag of run, profile, race); train's is "
                                       "--compose")),
    (["sweep"], ["--rungs", "eager"], "sweep's is --sweep-rungs"),
    (["predict"], ["--rungs", "eager"], "predict's is --compose"),
    # No command has it, or an abbreviation: argparse's words, still one line.
    (["run"], ["--nosuch"], "unrecognized arguments: --nosuch"),
    (["race"], ["--eval-every-base", "5"], "unrecognized arguments: --eval-every-base 5"),
])
def test_a_flag_that_cannot_matter_to_the_command_is_refused_in_one_line(command, args, says, tmp_path, capsys,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)  # a command that ran would write runs/ here
    assert main([*command, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"speedladder {command[0]}: error: ") and says in err, err
    assert len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_each_flag_spelling_means_one_thing_in_every_command():
    """A spelling that sets different fields in different commands is listed here with those fields, each of one
    meaning; any other spelling sets one field everywhere it is taken."""
    from speedladder.cli.gen import DEST, subcommands

    shared = {
        "--rungs": {"run.rungs", "race.rungs"},  # a ladder, each rung built on the best configuration so far
        "--compose": {"train.rungs", "run.profile.rungs", "parallel.rungs"},  # one configuration, no gate between
        "--ladder": {"run.ladder", "race.ladder"},  # a named ladder, climbed or raced
        "--stack-all": {"run.stack_all", "race.stack_all"},  # build on every rung, losses too
        "--run": {"train.run", "race.run"},  # that folder's winner, on its workload
        "--out": {"run.out", "check.keep"},  # where the new run's folder goes
        "--budget-minutes": {"tune.budget_minutes", "sweep.budget_minutes"},  # what is not started after it
        "--drift-limit": {"check.drift_limit", "compare.drift_limit"},  # the same warning
    }
    fields: dict[str, set[str]] = {}
    for p in subcommands(build_parser()).values():
        for action in p._actions:
            if action.dest.startswith(DEST):
                for spelling in action.option_strings:
                    fields.setdefault(spelling, set()).add(action.dest[len(DEST):])
    assert {s: f for s, f in fields.items() if len(f) > 1} == shared
    assert fields["--steps"] == {"train.steps"} and fields["--window-steps"] == {"run.timing.steps"}
    assert fields["--eval-every"] == {"train.eval_every"}
    assert fields["--eval-every-base-steps"] == {"race.eval_every"}
    assert fields["--nproc"] == {"parallel.nproc"} and fields["--nprocs"] == {"parallel.predict_nproc"}
    assert fields["--sweep-rungs"] == {"sweep.rungs"} and fields["--profile-rungs"] == {"run.profile.rungs"}


def test_report_of_a_folder_without_results(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no results.json" in capsys.readouterr().err
    (tmp_path / "results.json").write_text(json.dumps({"schema": "something else"}))
    assert main(["report", str(tmp_path)]) == 2
    assert "not a speedladder results file" in capsys.readouterr().err


def test_the_installed_command_fails_without_a_traceback(tmp_path):
    exe = shutil.which("speedladder")
    cmd = [exe] if exe else [sys.executable, "-m", "speedladder"]
    proc = subprocess.run([*cmd, "run", "--preset", "tiny", "--rungs", "eager,nope", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    from speedladder.rungs import RUNGS

    assert "fp8-tensorwise" in RUNGS and "softcap" in RUNGS  # one line that names every built-in rung
    assert proc.stderr.strip() == f"speedladder: error: unknown rung 'nope' (choose from {', '.join(RUNGS)})"
    assert "Traceback" not in proc.stdout + proc.stderr
