"""The race: held-out validation, time to a target loss over seeds, and verdicts by Welch's t-test (docs/race.md).

The verdict tests run real training on the tiny preset but time it with a synthetic clock (a stated cost per step
and per token, with seeded jitter), so what they assert is the rule, not this machine's speed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random

import numpy as np
import pytest
import torch
from conftest import CPU

from speedladder import stats
from speedladder.cli import main
from speedladder.config import RunConfig
from speedladder.data import BatchStream, Corpus, holdout, val_windows
from speedladder.racing import Race, equal_tokens, judge
from speedladder.records import RaceEntry, RaceRun, RaceSection
from speedladder.rungs import RUNGS, Env, Rung, StepSpec
from speedladder.settings import RaceConfig
from speedladder.workload import prepare

# -- held-out validation -------------------------------------------------------------------------------

def test_text_corpora_hold_out_their_last_tenth():
    work = prepare(RunConfig(preset="tiny", device="cpu"))
    assert (work.corpus.n_tokens, work.val.n_tokens) == (153_522, 17_058)  # 170,580 characters (PROVENANCE.md)
    assert work.split.val_from == "the last 10% of timemachine"
    assert "153,522 training tokens of timemachine; the last 10% of timemachine (17,058 tokens) held out" \
        in work.data_line


def test_no_val_window_ever_appears_in_a_training_batch(tmp_path):
    """Ids equal to their positions: every id a batch holds says where in the file it came from."""
    n = 60_000
    path = tmp_path / "pos.bin"
    np.arange(n, dtype=np.uint16).tofile(path)
    work = prepare(RunConfig(preset="tiny", device="cpu", data=str(path), vocab_size=n))
    cut = work.corpus.n_tokens
    assert cut == n - n // 10 and work.val.n_tokens == n // 10
    stream = work.stream(work.base_spec)
    big = work.stream(dataclasses.replace(work.base_spec, batch_size=64), seed=7)
    seen = torch.cat([torch.cat(next(s)) .flatten() for s in (stream, big) for _ in range(300)])
    gates = torch.cat([torch.cat(b).flatten() for b in work.gate_batches(work.base_spec, 50)])
    assert int(seen.max()) < cut and int(gates.max()) < cut  # every training and gate token lies before the cut
    x, y = work.val_set(work.cfg.seq_len)
    assert int(x.min()) >= cut and int(y.max()) < n  # every val token lies after it
    assert x.shape == (64, 32) and torch.equal(x[:, 1:], y[:, :-1])
    again, _ = work.val_set(work.cfg.seq_len)
    assert torch.equal(x, again)  # a fixed set: the same for every configuration and seed


def test_a_val_file_of_its_own_is_used_whole(tmp_path):
    train, val = tmp_path / "train.bin", tmp_path / "val.bin"
    np.full(20_000, 3, dtype=np.uint16).tofile(train)
    np.full(5_000, 7, dtype=np.uint16).tofile(val)
    work = prepare(RunConfig(preset="tiny", device="cpu", data=str(train), val_data=str(val), vocab_size=28))
    assert work.corpus.n_tokens == 20_000 and work.val.n_tokens == 5_000 and work.split.val_from == str(val)
    x, _ = work.val_set(32)
    assert set(x.unique().tolist()) == {7}


def test_val_windows_are_spread_evenly_and_fit():
    corpus = Corpus("c", "ids", 1000, torch.arange(1000))
    split = holdout(corpus)
    x, y = val_windows(split.val, 10, 5)
    assert x[:, 0].tolist() == [900, 922, 944, 967, 989]  # from the split's first token to its last full window
    assert int(y.max()) == 999
    stream = BatchStream(split.train, 4, 10, CPU, seed=0)
    assert all(int(torch.cat(next(stream)).max()) < 900 for _ in range(100))


# -- the statistics ------------------------------------------------------------------------------------

def test_a_no_op_is_called_win_or_loss_at_most_once_in_20_seeded_trials():
    """Both sides from one distribution (a mean of 10 s, 5% spread), 3 seeds each, no timing at all."""
    calls = []
    for trial in range(20):
        rng = random.Random(trial)
        a = [rng.gauss(10, 0.5) for _ in range(3)]
        b = [rng.gauss(10, 0.5) for _ in range(3)]
        calls.append(stats.verdict(a, b, 0.01)[0])
    assert sum(c != stats.NOISE for c in calls) <= 1
    rng = random.Random(1)
    many = [stats.verdict([rng.gauss(10, 0.5) for _ in range(3)], [rng.gauss(10, 0.5) for _ in range(3)], 0.01)[0]
            for _ in range(2000)]
    assert 0.005 < sum(c != stats.NOISE for c in many) / 2000 < 0.04  # both sides at 1%: near 2%


def test_a_real_change_is_found_and_its_p_value_is_scipys():
    from scipy import stats as sps

    slow, fast = [10.0, 10.4, 9.8], [7.1, 7.0, 7.4]
    verdict, w = stats.verdict(fast, slow, 0.01)
    assert verdict == stats.WIN and w.p_less == pytest.approx(
        sps.ttest_ind(fast, slow, equal_var=False, alternative="less").pvalue)
    assert stats.verdict(slow, fast, 0.01)[0] == stats.LOSS
    assert w.detectable is not None and 0 < w.detectable < 0.1
    # seeds_for agrees with Welch.detectable: n seeds with spreads of 5% and 2% of the base's mean.
    def sample(n: int, mean: float, sd: float) -> list[float]:
        z = np.arange(n) - (n - 1) / 2
        return list(mean + sd * z / z.std(ddof=1))

    n = stats.seeds_for(0.05, 0.02, 0.10, 0.01)
    assert n == 5
    assert stats.welch(sample(n, 10, 0.5), sample(n, 10, 0.2), 0.01).detectable <= 0.1
    assert stats.welch(sample(n - 1, 10, 0.5), sample(n - 1, 10, 0.2), 0.01).detectable > 0.1
    assert stats.seeds_for(0.0, 0.0, 0.1, 0.01) == 2 and stats.seeds_for(1.0, 1.0, 0.1, 0.01) is None


def _run(seed: int, seconds: float | None, tokens: list[int], val: list[float]) -> RaceRun:
    reached = seconds is not None
    return RaceRun(seed, "reached" if reached else "time cap", seconds=seconds, tokens=tokens[-1] if reached else None,
                   steps=len(tokens), curve_tokens=tokens, curve_val=val, curve_seconds=[0.0] * len(tokens),
                   train_seconds=seconds or 9.0)


def test_judge_on_a_saved_section():
    """Pure: a win, a no-op, a batch rung that needs more tokens, one that did not reach."""
    def entry(name, built_on, times, tokens_to, learning=False, reach=True):
        runs = [_run(i, t if reach else None, [0, tokens_to // 2, tokens_to], [3.0, 2.5, 2.0 if reach else 2.4])
                for i, t in enumerate(times)]
        return RaceEntry(name, [name], "rung", "", "speed", built_on, {}, "fp32", status="ok",
                         changes_learning=learning, runs=runs)

    section = RaceSection(target_loss=2.0, alpha=0.01, entries=[
        entry("eager", None, [10.0, 10.5, 9.7], 1000), entry("fast", "eager", [6.0, 6.3, 6.1], 1000),
        entry("same", "fast", [6.1, 6.0, 6.3], 1000),
        entry("batch", "same", [5.0, 5.2, 5.1], 4000, learning=True),
        entry("nope", "batch", [1.0, 1.0, 1.0], 1000, reach=False)])
    judge(section)
    got = {e.name: e.verdict for e in section.entries}
    assert got == {"eager": "baseline", "fast": "win", "same": "noise", "batch": "not a win", "nope": "did not reach"}
    batch = section.entry("batch")
    assert batch.token_ratio == pytest.approx(4.0) and batch.equal_tokens.worse  # worse where "same" stopped
    assert batch.speedup_prev == pytest.approx(6.133 / 5.1, rel=1e-3) and batch.p_win < 0.01
    assert section.fastest == "fast" and section.entry("fast").speedup_cum == pytest.approx(10.067 / 6.133, rel=1e-3)
    assert section.entry("nope").verdict_detail == "reached the target in 0 of 3 seeds"


def test_equal_tokens_interpolates_between_evaluations():
    a = RaceEntry("a", [], "rung", "", "speed", "b", {}, "fp32", runs=[
        _run(s, 1.0, [0, 100, 200], [3.0, 2.6, 2.2 + 0.01 * s]) for s in range(3)])
    b = RaceEntry("b", [], "rung", "", "speed", None, {}, "fp32", runs=[
        _run(s, 1.0, [0, 50, 100, 150], [3.0, 2.5, 2.0, 1.9 + 0.02 * s]) for s in range(3)])
    eq = equal_tokens(a, b, 0.01)
    assert eq.tokens == [150, 150, 150] and eq.loss == pytest.approx([2.4, 2.405, 2.41])
    assert eq.base_loss == pytest.approx([1.9, 1.92, 1.94]) and eq.worse and eq.p_worse < 0.01


# -- races with a synthetic clock ----------------------------------------------------------------------

class StepClock:
    """Each step of a spec costs `per_step` plus `per_token` for each of its tokens, times seeded jitter (±2%)."""

    def __init__(self, per_step: float, per_token: float, seed: int = 0) -> None:
        self.per_step, self.per_token = per_step, per_token
        self.rng = random.Random(seed)

    def start(self) -> None:
        pass

    def stop(self, steps: int, spec: StepSpec) -> float:
        return steps * (self.per_step + self.per_token * spec.tokens_per_step) * self.rng.uniform(0.98, 1.02)


RACE = RaceConfig(calibrate_steps=80, eval_every=10)


def _race(monkeypatch, tmp_path, rungs: tuple[str, ...], clock: StepClock, **run) -> RaceSection:
    planted = {"half-lr": Rung("half-lr", "planted: tokens/s unchanged, half the learning rate", "speed",
                               lambda s, e: dataclasses.replace(s, lr_scale=s.lr_scale * 0.5)),
               "same": Rung("same", "planted: changes nothing", "speed", lambda s, e: s)}
    for name, rung in planted.items():
        monkeypatch.setitem(RUNGS, name, rung)
    work = prepare(RunConfig(preset="tiny", device="cpu", rungs=rungs, **run))
    race = Race(work, tmp_path, RACE, clock=clock)
    race.prepare_ladder(rungs)
    return race.run().race  # type: ignore[return-value]


def test_a_rung_that_keeps_tokens_per_s_but_halves_the_learning_rate_loses(monkeypatch, tmp_path):
    s = _race(monkeypatch, tmp_path, ("eager", "half-lr", "same"), StepClock(0.0, 1e-5))
    eager, half, same = s.entries
    assert s.time_cap_s == pytest.approx(3 * s.calibration.train_seconds) and s.cap_from.startswith("3x eager fp32")
    assert half.tokens_per_s_prev == pytest.approx(1.0, abs=0.03)  # tokens/s alone would call it noise
    assert half.verdict == "loss" and half.p_loss < 0.01 and half.speedup_prev < 0.8
    assert half.changes_learning and half.equal_tokens is not None and half.equal_tokens.worse
    assert same.verdict == "noise" and not same.changes_learning and same.equal_tokens is None  # unchanged: noise
    assert all(r.reached for e in s.entries for r in e.runs) and len(eager.runs) == 3


def test_a_batch_up_that_needs_more_tokens_than_it_saves_time_is_not_a_win(monkeypatch, tmp_path):
    # A fixed cost per step makes the 4x batch 1.2x the tokens/s (overhead 36.6 per-token costs, 128 tokens a step).
    s = _race(monkeypatch, tmp_path, ("eager", "batch"), StepClock(36.6e-5, 1e-5), batch_multiplier=4)
    _, batch = s.entries
    assert batch.tokens_per_s_prev == pytest.approx(1.2, rel=0.03)
    assert batch.token_ratio > 1.2  # it needs more tokens than its speed buys back
    assert batch.verdict in ("loss", "not a win") and batch.speedup_prev < 1
    assert batch.changes_learning and batch.equal_tokens.worse


def test_a_target_no_configuration_reaches_is_not_an_error(tmp_path, capsys):
    rc = main(["race", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,bf16", "--seeds", "2",
               "--target-loss", "0.05", "--time-cap", "0.3", "--calibrate-steps", "20", "--quiet",
               "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    (run_dir,) = tmp_path.iterdir()
    race = json.loads((run_dir / "results.json").read_text())["race"]
    assert race["target_from"] == "--target-loss" and race["calibration"] is None
    for e in race["entries"]:
        assert e["verdict"] == "did not reach" and [r["stopped"] for r in e["runs"]] == ["time cap"] * 2
        assert all(r["best_loss"] is not None and r["best_seconds"] is not None for r in e["runs"])
    assert "seed 0 did not reach 0.0500 (time cap); its best val loss" in out
    assert "no configuration reached the target in every seed." in out


# -- bad input ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--target-loss", "nan"], "the target loss must be a positive finite number, got nan"),
    (["--target-loss", "-1"], "the target loss must be a positive finite number, got -1.0"),
    (["--target-loss", "inf"], "the target loss must be a positive finite number, got inf"),
    (["--seeds", "1"], "a verdict needs at least 2 seeds"),
    (["--batch-size", "600"], "too small for one batch of 600 x 32"),
    (["--combos", "eager+warp"], "unknown rung 'warp' in --combos"),
])
def test_bad_race_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    assert main(["race", "--preset", "tiny", "--device", "cpu", *args, "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # refused before any run folder


def test_a_val_file_that_does_not_match_is_one_line_and_exit_2(tmp_path, capsys):
    train, val = tmp_path / "train.bin", tmp_path / "val.bin"
    np.full(20_000, 3, dtype=np.uint16).tofile(train)
    np.full(5_000, 300, dtype=np.uint16).tofile(val)
    for cmd in (["race"], ["train", "--steps", "2"], ["run", "--rungs", "eager", "--no-profile"]):
        assert main([*cmd, "--preset", "tiny", "--device", "cpu", "--data", str(train), "--val-data", str(val),
                     "--vocab-size", "28", "--out", str(tmp_path / "runs")]) == 2
        err = capsys.readouterr().err.strip()
        assert "--val-data does not match the vocabulary" in err and "id 300 at position 0" in err
        assert len(err.splitlines()) == 1
    assert main(["race", "--preset", "tiny", "--device", "cpu", "--data", str(train), "--val-data", "timemachine",
                 "--out", str(tmp_path / "runs")]) == 2
    assert "must be a token file (.bin), as --data" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


# -- end to end ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def raced(tmp_path_factory):
    out = tmp_path_factory.mktemp("race")
    # A generous cap: on a machine shared with other tests a tiny step's time can vary many times over.
    assert main(["race", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,bf16,batch,muon",
                 "--calibrate-steps", "60", "--time-cap", "60", "--quiet", "--out", str(out)]) == 0
    (run_dir,) = out.iterdir()
    return run_dir


def test_the_race_is_saved_typed_and_complete(raced):
    from speedladder import results

    saved = results.load(raced)
    s = saved.race
    assert saved.kind == "race" and saved.status == "complete" and saved.rungs == []
    assert saved.corpus["val_from"] == "the last 10% of timemachine" and saved.corpus["val_tokens"] == 17_058
    assert s.seeds == [0, 1, 2] and s.target_from.startswith("eager fp32's val loss after 60 steps (seed 3)")
    assert s.target_loss == s.calibration.curve_val[-1] and s.calibration.curve_steps[-1] == 60
    assert s.time_cap_s == 60 and s.cap_from == "--time-cap"
    assert [e.name for e in s.entries] == ["eager", "bf16", "batch", "muon"]
    assert [e.built_on for e in s.entries] == [None, "eager", "bf16", "batch"]
    for e in s.entries:
        assert e.status == "ok" and e.causality.passed and len(e.runs) == 3
        assert e.verdict in ("baseline", "win", "loss", "noise", "not a win", "did not reach")
        for r in e.runs:
            assert r.curve_steps[0] == 0 and r.curve_seconds[0] == 0.0  # the curve starts before any training
            assert r.curve_seconds == sorted(r.curve_seconds) and r.eval_seconds > 0
            if r.reached:
                assert r.curve_val[-1] <= s.target_loss < min(v for v in r.curve_val[:-1])
                assert r.seconds == r.curve_seconds[-1] and r.tokens == r.curve_tokens[-1]
    batch, muon = s.entry("batch"), s.entry("muon")
    assert batch.spec["batch_size"] == 8 and batch.changes_learning and batch.equal_tokens is not None
    assert muon.spec["optimizer"] == "muon" and muon.changes_learning
    judged = [e for e in s.entries if e.built_on and e.reached_all and s.entry(e.built_on).reached_all]
    assert judged and all(e.p_win is not None and e.p_loss is not None for e in judged)


def test_the_race_prints_and_draws_from_its_saved_file(raced, capsys):
    assert main(["report", str(raced)]) == 0
    out = capsys.readouterr().out
    assert "speedladder race · tiny" in out and "p win" in out and "s to target" in out
    assert "verdict: Welch's t-test on the times" in out
    page = (raced / "report.html").read_text()
    assert 'id="race"' in page and 'id="chart-race-curves"' in page and "p loss" in page
    assert (raced / "waterfall.png").stat().st_size > 10_000


def test_compare_and_check_read_races(raced, tmp_path, capsys):
    assert main(["compare", str(raced), str(raced)]) == 0
    assert "race: seconds to the target val loss" in capsys.readouterr().out
    assert main(["check", "--baseline", str(raced), "--against", str(raced)]) == 0
    assert "configuration(s) reached the target" in capsys.readouterr().out
    # Times set by hand, so that what is judged is the rule and not how busy the machine was during the race.
    base, slower = (json.loads((raced / "results.json").read_text()) for _ in range(2))
    for saved, scale in ((base, 1.0), (slower, 1.5)):
        for e in saved["race"]["entries"]:
            for r, t in zip(e["runs"], (1.0, 1.02, 0.98)):
                r["stopped"], r["seconds"] = "reached", t * (scale if e["name"] == "bf16" else 1.0)
    for name, saved in (("base", base), ("slower", slower)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(saved))
    assert main(["check", "--baseline", str(tmp_path / "base"), "--against", str(tmp_path / "slower")]) == 1
    assert "check: regression: bf16: 1.50× the baseline's time to the target" in capsys.readouterr().out


def test_batch_lr_scale_sets_the_rung_learning_rate(tiny):
    env = Env("cpu", None, 4, batch_lr_scale="sqrt")
    spec = RUNGS["batch"].transform(tiny.base_spec, env)
    assert spec.batch_size == 16 and spec.lr_scale == 2.0 and not spec.same_update
    step = tiny.step(spec)
    assert step.optimizer.param_groups[0]["lr"] == pytest.approx(2e-3)
    linear = RUNGS["batch"].transform(tiny.base_spec, dataclasses.replace(env, batch_lr_scale="linear"))
    assert linear.lr_scale == 4.0 and "4x eager's" in linear.update_change
    assert RUNGS["batch"].transform(tiny.base_spec, Env("cpu", None, 4)).same_update


def test_evaluation_is_in_eval_mode_and_puts_the_flags_back(tiny):
    step = tiny.step(tiny.base_spec)
    seen = []
    step.model.register_forward_hook(lambda m, i, o: seen.append((m.training, torch.is_grad_enabled())))
    x, y = tiny.val_set(tiny.cfg.seq_len)
    v = float(step.evaluate(x, y, 16))
    assert seen == [(False, False)] * 4 and step.model.training  # 64 sequences, 16 at a time
    assert math.isfinite(v) and abs(v - math.log(28)) < 0.5  # near uniform over 28 symbols at initialization


def test_combos_and_the_python_api_race_each_set_against_eager(tmp_path):
    import speedladder

    saved = speedladder.race(preset="tiny", device="cpu", combos=[["bf16"], ["bf16", "muon"]], seeds=2,
                             out=str(tmp_path), quiet=True,
                             race_options={"calibrate_steps": 30, "time_cap_s": 60.0})
    s = saved.race
    assert [(e.name, e.role, e.built_on) for e in s.entries] == [("eager", "rung", None), ("bf16", "combo", "eager"),
                                                                 ("bf16+muon", "combo", "eager")]
    assert s.entry("bf16+muon").spec["optimizer"] == "muon" and s.entry("bf16+muon").changes_learning
    assert all(len(e.runs) == 2 for e in s.entries) and saved.status == "complete"
    (run_dir,) = tmp_path.iterdir()
    assert {"results.json", "waterfall.png", "report.html"} <= {p.name for p in run_dir.iterdir()}


def test_check_re_runs_a_race_with_its_own_configuration(raced):
    """The race's config.toml, and what check rebuilds from its results.json, are the race that was run."""
    from speedladder import codec, settings
    from speedladder.cli.check import rerun_settings

    saved = json.loads((raced / "results.json").read_text())
    command, again = rerun_settings(saved)
    written = codec.from_data(settings.Settings, settings.read(raced / "config.toml"))
    assert command == "race" and again.race == written.race and again.run == written.run
    race = again.race
    assert race.rungs == ("eager", "bf16", "batch", "muon") and again.run.rungs == race.rungs
    assert (again.run.preset, again.run.batch_size, again.run.seq_len, again.run.seed) == ("tiny", 4, 32, 0)
    assert (race.seeds, race.calibrate_steps, race.eval_every, race.time_cap_s) == (3, 60, 10, 60.0)
