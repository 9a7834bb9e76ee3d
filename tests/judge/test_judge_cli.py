"""`speedladder judge` end to end on the tiny preset: one JSON object that validates against the shipped schema,
the documented exit status, bad input in one line with nothing judged, workers stopped off the clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli

from speedladder.judge import report
from speedladder.records import storage

PLANTED = Path(__file__).parent / "planted"
TINY = ["--preset", "tiny", "--device", "cpu", "--quiet"]


def judge(tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    rc, out, err = cli("judge", *args, *TINY, "--out", str(tmp_path / "runs"))
    assert out.count("\n") == 1 and out.endswith("}\n"), out  # one object on one line, nothing else on stdout
    return rc, json.loads(out), err


@pytest.mark.parametrize("args, says", [
    (["nosuch.py"], "candidate nosuch.py: no such file or folder"),
    (["README.md"], "give a rung file (.py), a config file (.toml"),
    ([str(PLANTED / "noop.py"), "--false-keep", "0.7"], "--false-keep is an error rate"),
    ([str(PLANTED / "noop.py"), "--max-seeds", "2"], "--max-seeds must be at least 3"),
    ([str(PLANTED / "noop.py"), "--base", "nosuch"], "base nosuch: no such file or folder"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_judged(args, says, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2])
    rc, out, err = cli("judge", *args, *TINY, "--out", str(tmp_path / "runs"))
    assert rc == 2 and out == "" and says in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_a_config_made_for_another_workload_is_refused(tmp_path):
    other = tmp_path / "winner.toml"
    other.write_text('[run]\npreset = "d2l-cpu"\nrungs = ["eager", "bf16"]\n')
    rc, out, err = cli("judge", str(other), *TINY, "--out", str(tmp_path / "runs"))
    assert rc == 2 and out == ""
    assert "was made for another workload (preset 'd2l-cpu' there, 'tiny' here)" in err, err


@pytest.mark.slow  # worker processes, a gate, a race of three seeds or more: about 15 s on two cores
def test_a_no_op_is_reverted_as_noise_and_its_object_validates(tmp_path):
    rc, got, _ = judge(tmp_path, str(PLANTED / "noop.py"))
    assert report.check(got) == []
    assert (rc, got["decision"]) in ((1, "revert"), (3, "undecided"))  # never a keep but by the stated chance
    assert got["why"] in ("noise", "budget")
    assert got["candidate"]["rungs"] == ["no-op"] and got["base"]["kind"] == "eager"
    assert got["gate"]["passed"] and got["gamed"] == []
    run_dir = Path(got["run_dir"])
    assert json.loads((run_dir / "judge.json").read_text()) == got  # what was printed is what was saved
    saved = storage.load(run_dir)  # the race as `speedladder report` reads it
    assert saved.race is not None and [e.name for e in saved.race.entries] == ["eager", "noop"]
    seeds = got["seeds"]["used"]
    assert seeds >= 3 and all(len(e.own_runs) == seeds for e in saved.race.entries)
    assert got["criterion"]["candidate"]["tokens"] == got["criterion"]["budget_tokens"]


@pytest.mark.slow
def test_a_real_win_is_kept_with_its_interval_above_one(tmp_path):
    rc, got, _ = judge(tmp_path, str(PLANTED / "lr3.py"))
    assert report.check(got) == []
    assert (rc, got["decision"], got["why"]) == (0, "keep", "win"), got["detail"]
    low, high = got["effect"]["interval"]
    assert 1 < low <= got["effect"]["speedup"] <= high
    assert got["effect"]["p_win"] < got["rule"]["level_keep"]
    speed = got["speed"]
    assert speed["candidate_time_s"] < speed["base_time_s"] and speed["token_ratio"] < 1  # fewer tokens, sooner
    assert 0.8 < speed["tokens_per_s_ratio"] < 1.25  # the same step: tokens/s alone would not have found it


@pytest.mark.slow
def test_undecided_when_the_budget_ends_first(tmp_path):
    rc, got, _ = judge(tmp_path, str(PLANTED / "lr3.py"), "--budget-s", "1")
    assert report.check(got) == []
    assert (rc, got["decision"], got["why"]) == (3, "undecided", "budget")
    assert got["seeds"]["used"] == 0 and got["effect"] is None  # never a guess


@pytest.mark.slow
@pytest.mark.parametrize("planted, why", [
    ("clock.py", "gamed: replaced time.perf_counter"),
    ("valsplit.py", "gamed: opened the data (timemachine.txt)"),
    ("stale.py", "gamed: stale outputs: two different batches gave the same loss"),
    ("loss.py", "gamed: replaced torch.nn.functional.cross_entropy"),
    ("peek.py", "broke-causality"),
    ("evalprec.py", "gamed: evaluates another function"),
    ("evalpatch.py", "gamed: replaced speedladder.step.train_step.TrainStep.evaluate"),
])
def test_a_gaming_candidate_is_caught_and_named(planted, why, tmp_path):
    """Each planted candidate is reverted before any race, and `why` names what it did."""
    rc, got, _ = judge(tmp_path, str(PLANTED / planted))
    assert report.check(got) == []
    assert (rc, got["decision"]) == (1, "revert") and got["why"].startswith(why), got["why"]
    assert got["seeds"]["used"] == 0


def _state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2]


@pytest.mark.slow  # two worker processes
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc (Linux)")
def test_the_workers_are_stopped_whenever_they_are_not_answering(tmp_path):
    """Between two requests a worker's process group is stopped: nothing of a side runs off the clock."""
    from speedladder.cli import build_parser
    from speedladder.cli.gen import to_settings
    from speedladder.judge.referee import Referee
    from speedladder.judge.remote import Evaluator
    from speedladder.progress import Progress

    ns, _ = build_parser().parse_known_args(["judge", str(PLANTED / "noop.py"), *TINY, "--out", str(tmp_path)])
    ref = Referee(to_settings(ns), ns.candidate, Progress(quiet=True))
    work = ref._prepare()
    try:
        ref._start(work, Evaluator(work))
        assert [_state(w.proc.pid) for w in ref.workers] == ["T", "T"]
        for w in ref.workers:  # both allocators alike, whatever each did before the race
            environ = Path(f"/proc/{w.proc.pid}/environ").read_bytes().split(b"\0")
            assert b"MALLOC_MMAP_THRESHOLD_=33554432" in environ
        assert ref.workers[1].request("check") == {"problems": []}
        assert [_state(w.proc.pid) for w in ref.workers] == ["T", "T"]
    finally:
        ref._close()
    assert all(w.proc.poll() is not None for w in ref.workers)
