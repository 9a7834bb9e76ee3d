"""The race: held-out validation, time to a target loss over seeds, and verdicts by Welch's t-test (docs/race.md).

The verdict tests run real training on the tiny preset but time it with a synthetic clock (a stated cost per step
and per token, with seeded jitter), so what they assert is the rule, not this machine's speed.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CPU

from speedladder.cli import main
from speedladder.config.run import RunConfig
from speedladder.config.settings import RaceConfig
from speedladder.data.batches import BatchStream, val_windows
from speedladder.data.corpus import Corpus, holdout
from speedladder.progress import LOGGER, Progress
from speedladder.racing import Race, equal_tokens, judge
from speedladder.records import RaceEntry, RaceRun, RaceSection
from speedladder.rungs import RUNGS, Env, Rung
from speedladder.spec import StepSpec
from speedladder.step.workload import prepare

DOCS = Path(__file__).resolve().parents[2] / "docs"

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


# -- the verdict on a saved section (the statistics themselves: test_race_stats.py) ---------------------

def _run(seed: int, seconds: float | None, tokens: list[int], val: list[float], stage: int | None = None) -> RaceRun:
    reached = seconds is not None
    return RaceRun(seed, "reached" if reached else "time cap", seconds=seconds, tokens=tokens[-1] if reached else None,
                   steps=len(tokens), curve_tokens=tokens, curve_val=val, curve_seconds=[0.0] * len(tokens),
                   train_seconds=seconds or 9.0, stage=stage)


def test_judge_on_a_saved_section():
    """Pure: a win, a no-op, a batch rung that needs more tokens, one that did not reach; each stage holds the rung
    and its base, run afresh, paired by seed."""
    runs: dict[str, list[RaceRun]] = {}

    def add(name, stage, times, tokens_to, reach=True):
        runs.setdefault(name, []).extend(
            _run(i, t if reach else None, [0, tokens_to // 2, tokens_to], [3.0, 2.5, 2.0 if reach else 2.4], stage)
            for i, t in enumerate(times))

    add("eager", 1, [10.0, 10.5, 9.7, 10.2], 1000)
    add("fast", 1, [6.0, 6.3, 6.1, 6.2], 1000)
    add("fast", 2, [6.1, 6.2, 6.0, 6.2], 1000)
    add("same", 2, [6.1, 6.3, 6.0, 6.1], 1000)
    add("same", 3, [6.2, 6.1, 6.0, 6.3], 1000)
    add("batch", 3, [5.0, 5.2, 5.1, 5.0], 4000)
    add("same", 4, [6.1, 6.0, 6.2, 6.1], 1000)
    add("nope", 4, [1.0, 1.0, 1.0, 1.0], 1000, reach=False)

    def entry(name, built_on, stage, learning=False):
        return RaceEntry(name, [name], "rung", "", "speed", built_on, {}, "fp32", status="ok", stage=stage,
                         changes_learning=learning, runs=runs[name])

    section = RaceSection(target_loss=2.0, alpha=0.01, entries=[
        entry("eager", None, 1), entry("fast", "eager", 1), entry("same", "fast", 2),
        entry("batch", "same", 3, learning=True), entry("nope", "same", 4)])
    judge(section)
    got = {e.name: e.verdict for e in section.entries}
    # nope stopped at 9 s in every seed where same took about 6: at least 1.5x slower, a loss.
    assert got == {"eager": "baseline", "fast": "win", "same": "noise", "batch": "not a win", "nope": "loss"}
    batch = section.entry("batch")
    assert batch.token_ratio == pytest.approx(4.0) and batch.equal_tokens.worse  # worse where "same" stopped
    assert batch.speedup_prev == pytest.approx(math.exp(-np.mean(np.log(np.array([5.0, 5.2, 5.1, 5.0])
                                                                          / [6.2, 6.1, 6.0, 6.3]))))
    assert batch.p_win < 0.01 and batch.paired.seeds == [0, 1, 2, 3]
    fast, same = section.entry("fast"), section.entry("same")
    assert section.fastest == "same" or section.fastest == "fast"
    assert same.speedup_cum == pytest.approx(fast.speedup_cum * same.speedup_prev)  # the chain of paired ratios
    nope = section.entry("nope")
    assert nope.speedup_bound == "at most" and nope.p_win == 1.0 and "stopped before the target in 4 of 4" in \
        nope.verdict_detail


def test_equal_tokens_interpolates_between_evaluations_and_pairs_by_seed():
    a = RaceEntry("a", [], "rung", "", "speed", "b", {}, "fp32", runs=[
        _run(s, 1.0, [0, 100, 200], [3.0, 2.6, 2.2 + 0.01 * s]) for s in range(3)])
    b = RaceEntry("b", [], "rung", "", "speed", None, {}, "fp32", runs=[
        _run(s, 1.0, [0, 50, 100, 150], [3.0, 2.5, 2.0, 1.9 + 0.02 * s]) for s in range(3)])
    eq = equal_tokens(a, b, 0.01)
    assert eq.tokens == [150, 150, 150] and eq.loss == pytest.approx([2.4, 2.405, 2.41])
    assert eq.base_loss == pytest.approx([1.9, 1.92, 1.94]) and eq.worse and eq.p_worse < 0.01


def test_the_crossing_is_interpolated_between_the_two_evaluations_around_it():
    from speedladder.racing.runs import cross

    r = RaceRun(0, "", curve_steps=[0, 10, 20], curve_tokens=[0, 640, 1280], curve_seconds=[0.0, 1.0, 2.5],
                curve_val=[3.0, 2.4, 2.0])
    cross(r, 2.1)  # a quarter of the way from 2.4 down to 2.0 lies 2.3; 2.1 lies three quarters
    assert (r.seconds, r.tokens, r.steps) == pytest.approx((1.0 + 0.75 * 1.5, 640 + 0.75 * 640, 17.5))
    assert (r.first_eval_seconds, r.first_eval_tokens, r.first_eval_steps) == (2.5, 1280, 20)


# -- races with a synthetic clock ----------------------------------------------------------------------

class StepClock:
    """Each step of a spec costs `per_step` plus `per_token` for each of its tokens, times seeded jitter (±2%), and
    times `slow[optimizer]` for a spec of that optimizer (a planted rung with the same math that is slower)."""

    def __init__(self, per_step: float, per_token: float, seed: int = 0, slow: dict[str, float] | None = None,
                 interrupt: str | None = None) -> None:
        self.per_step, self.per_token = per_step, per_token
        self.rng = random.Random(seed)
        self.slow = slow or {}
        self.interrupt, self.stops = interrupt, 0  # Ctrl-C on the third stretch of that optimizer's spec

    def start(self) -> None:
        pass

    def stop(self, steps: int, spec: StepSpec) -> float:
        self.stops += spec.optimizer == self.interrupt
        if self.stops >= 3:
            raise KeyboardInterrupt
        return (steps * (self.per_step + self.per_token * spec.tokens_per_step) * self.slow.get(spec.optimizer, 1.0)
                * self.rng.uniform(0.98, 1.02))


RACE = RaceConfig(calibrate_steps=80, eval_every=10)
# The same update as AdamW's for-loop, through torch's foreach implementation: a rung with the same math, which the
# synthetic clock makes slower.
SLOW = Rung("slow", "planted: the same math, slower per step", "speed",
            lambda s, e: dataclasses.replace(s, optimizer="adamw-foreach"))


def _race(monkeypatch, tmp_path, rungs: tuple[str, ...], clock: StepClock, race: RaceConfig = RACE,
          progress: Progress | None = None, **run) -> RaceSection:
    planted = {"half-lr": Rung("half-lr", "planted: tokens/s unchanged, half the learning rate", "speed",
                               lambda s, e: dataclasses.replace(s, lr_scale=s.lr_scale * 0.5)),
               "same": Rung("same", "planted: changes nothing", "speed", lambda s, e: s), "slow": SLOW}
    for name, rung in planted.items():
        monkeypatch.setitem(RUNGS, name, rung)
    work = prepare(RunConfig(preset="tiny", device="cpu", rungs=rungs, **run))
    contest = Race(work, tmp_path, race, progress, clock=clock)
    contest.prepare_ladder(rungs)
    return contest.run().race  # type: ignore[return-value]


@pytest.mark.slow
def test_a_rung_that_keeps_tokens_per_s_but_halves_the_learning_rate_loses(monkeypatch, tmp_path):
    s = _race(monkeypatch, tmp_path, ("eager", "half-lr", "same"), StepClock(0.0, 1e-5))
    eager, half, same = s.entries
    assert s.time_cap_s == pytest.approx(4 * s.calibration.train_seconds) and s.cap_from.startswith("twice --cap-factor")
    assert half.tokens_per_s_prev == pytest.approx(1.0, abs=0.03)  # tokens/s alone would call it noise
    assert half.verdict == "loss" and half.p_loss < 0.01 and half.speedup_prev < 0.8 and half.p_win > 0.5
    assert half.changes_learning and half.equal_tokens is not None and half.equal_tokens.worse
    assert not half.built_upon and same.built_on == "eager"  # a loss is not built upon
    assert same.verdict == "noise" and not same.changes_learning and same.equal_tokens is None  # unchanged: noise
    assert all(r.reached for r in eager.own_runs + same.own_runs) and len(eager.own_runs) == 4
    # Two stages, each run afresh in an order alternating from seed to seed (ABBA over the seeds).
    assert [st.orders for st in s.stages] == [[["eager", "half-lr"], ["half-lr", "eager"]] * 2,
                                              [["eager", "same"], ["same", "eager"]] * 2]
    assert len(eager.runs) == 8 and {r.stage for r in eager.runs} == {1, 2} and eager.stage == 1
    for r in same.own_runs:
        assert r.curve_seconds[-2] < r.seconds <= r.first_eval_seconds <= r.curve_seconds[-1] or \
            r.curve_tokens[-1] >= s.budget_tokens  # interpolated, raw figures kept; runs go on to the budget
        assert r.first_eval_seconds is not None and r.cap_from


@pytest.mark.slow
def test_a_rung_with_the_same_math_30_percent_slower_is_a_loss_at_the_default_seeds(monkeypatch, tmp_path):
    clock = StepClock(0.0, 1e-5, slow={"adamw-foreach": 1.3})
    turns: list[str] = []
    stop = clock.stop
    clock.stop = lambda steps, spec: (turns.append(spec.optimizer), stop(steps, spec))[1]  # type: ignore[method-assign]
    s = _race(monkeypatch, tmp_path, ("eager", "slow"), clock)
    assert len(s.seeds) == RaceConfig().seeds
    slow = s.entry("slow")
    assert slow.verdict == "loss" and slow.p_win > 0.5 and slow.speedup_prev == pytest.approx(1 / 1.3, rel=0.05)
    # Within a seed the two runs take turns, stretch by stretch, the one with less training time next.
    race_turns = turns[8:]  # after the calibration's 8 stretches
    switches = sum(a != b for a, b in itertools.pairwise(race_turns))
    assert switches > 8 * len(s.seeds)  # one after the other would switch at most twice a seed


@pytest.mark.slow
def test_a_10x_slower_rung_is_stopped_at_twice_its_base_and_not_built_upon(monkeypatch, tmp_path):
    clock = StepClock(0.0, 1e-5, slow={"adamw-foreach": 10.0})
    s = _race(monkeypatch, tmp_path, ("eager", "slow", "same"), clock)
    eager, slow, same = s.entries
    assert slow.verdict == "loss" and slow.built_upon is False and same.built_on == "eager"
    assert all(r.stopped == "time cap" for r in slow.own_runs)
    # Stopped at twice eager's time in both of its first two seeds (each side starting one): a loss by that alone,
    # and its other seeds are not run.
    assert s.stages[0].decided == ["slow"] and len(slow.own_runs) == 2 and len(s.stages[0].orders) == 2
    assert "needed more than 2x eager's time in each of its 2 seeds" in slow.verdict_detail
    for r in slow.own_runs:  # at twice eager's time in the same seed, or eager's median when it ran first
        mine = next(b for b in eager.runs_in(slow.stage) if b.seed == r.seed)
        assert r.cap_from.startswith("2x eager's")
        if "in this seed" in r.cap_from:
            assert r.cap_s == pytest.approx(2 * mine.seconds)
        assert r.cap_s <= r.train_seconds < r.cap_s * 1.5
    # The whole race costs about 2 x eager per slow run, not a 10x run: the runs to the cap, not past it.
    assert sum(r.train_seconds for r in slow.own_runs) < 3 * sum(r.seconds for r in eager.runs_in(slow.stage))
    (tmp_path / "stacked").mkdir()
    stacked = _race(monkeypatch, tmp_path / "stacked", ("eager", "slow", "same"), clock,
                    race=dataclasses.replace(RACE, stack_all=True))
    assert stacked.entry("same").built_on == "slow" and stacked.stack_all


class Lines(logging.Handler):
    """The progress lines as a log would hold them: (phase, message)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((getattr(record, "phase", ""), record.getMessage()))


class SeedClock(StepClock):
    """A StepClock whose planted slowdown differs from seed to seed: `by_seed[seed]` times a step of the slow
    optimizer. The race tells the clock its seed as each run begins (Race.begin, patched in the test)."""

    def __init__(self, per_step: float, per_token: float, slow: str, by_seed: dict[int, float]) -> None:
        super().__init__(per_step, per_token)
        self.slow_optimizer, self.by_seed, self.seed = slow, by_seed, -1

    def stop(self, steps: int, spec: StepSpec) -> float:
        factor = self.by_seed.get(self.seed, 1.0) if spec.optimizer == self.slow_optimizer else 1.0
        return super().stop(steps, spec) * factor


@pytest.mark.slow
def test_a_25_percent_slower_rung_that_is_noise_is_not_built_upon(monkeypatch, tmp_path):
    # 1.25x slower on average (the geometric mean of 1.05, 1.5, 1.1 and 1.4), but spread so widely over the 4 seeds
    # that a paired test at p < 0.01 cannot call it a loss: noise. Its best estimate is below 1.0x, so the next stage
    # builds on its base: what to build on follows the estimate, a claim needs its test.
    factors = [1.05, 1.5, 1.1, 1.4]
    assert math.prod(factors) ** 0.25 == pytest.approx(1.25, abs=0.01)
    clock = SeedClock(0.0, 1e-5, "adamw-foreach", dict(enumerate(factors)))
    begin = Race.begin

    def told(self, step, seed, *args, **kwargs):
        clock.seed = seed
        return begin(self, step, seed, *args, **kwargs)

    monkeypatch.setattr(Race, "begin", told)
    log = Lines()  # the progress lines, as a log holds them
    lines = log.lines
    monkeypatch.setattr(LOGGER, "handlers", [log])
    monkeypatch.setattr(LOGGER, "level", logging.INFO)
    s = _race(monkeypatch, tmp_path, ("eager", "slow", "same"), clock, progress=Progress())
    eager, slow, same = s.entries
    # Each stage shows its progress seed by seed, with its elapsed time and an estimate of what is left.
    stage = [m for phase, m in lines if phase == "race stage 1"]
    assert stage[0] == "eager, slow, 4 seeds" and stage[-1].startswith("eager, slow, 4 seeds: done in ")
    assert [m.split(", about")[0].split("elapsed, ")[1] for m in stage[1:4]] == ["1/4", "2/4", "3/4"]
    assert all(m.endswith(f"left; seed {i} done") for i, m in enumerate(stage[1:4]))
    assert any(phase == "race slow" and m.startswith("noise, 0.8")
               and m.endswith("; not built upon (slower): the next stage builds on eager") for phase, m in lines)
    assert len(slow.own_runs) == 4 and all(r.reached for r in slow.own_runs)
    assert slow.verdict == "noise" and 0.01 < slow.p_loss < 0.2 and slow.p_win > 0.5
    assert slow.speedup_prev == pytest.approx(1 / 1.25, rel=0.05)
    assert slow.built_upon is False and same.built_on == "eager" and same.stage == 2
    assert same.spec.optimizer == eager.spec.optimizer != "adamw-foreach"
    from speedladder.records import storage
    from speedladder.report.race_table import race_lines

    lines = race_lines(storage.load(tmp_path))  # the notes, from the saved file
    assert any(line.startswith("slow: not built upon (slower) — noise, 0.8") and "no loss at p < 0.01" in line
               and line.endswith("same is built on eager.") for line in lines), lines
    (tmp_path / "stacked").mkdir()
    stacked = _race(monkeypatch, tmp_path / "stacked", ("eager", "slow", "same"), clock,
                    race=dataclasses.replace(RACE, stack_all=True))
    assert stacked.entry("slow").verdict == "noise" and stacked.entry("same").built_on == "slow"


def test_a_race_interrupted_mid_stage_keeps_its_runs_and_judges_without_raising(monkeypatch, tmp_path):
    from speedladder.records import storage

    with pytest.raises(KeyboardInterrupt):
        _race(monkeypatch, tmp_path, ("eager", "slow"),
              StepClock(0.0, 1e-5, slow={"adamw-foreach": 10.0}, interrupt="adamw-foreach"))
    saved = storage.load(tmp_path)
    assert saved.status == "interrupted"
    eager, slow = saved.race.entries
    # Stopped in slow's third stretch: the runs done before the stop are kept (eager's, and slow's of seed 0, stopped
    # at twice eager's time), the ones under way are not. One pair at most: judged without a test, and no exception.
    assert 1 <= len(eager.runs) <= 2 and len(slow.runs) <= 1
    assert {r.seed for r in slow.runs} <= {r.seed for r in eager.runs} and all(r.stopped == "time cap" for r in slow.runs)
    assert eager.verdict == "baseline" and slow.verdict in (None, "did not reach")


@pytest.mark.slow
def test_a_batch_up_that_needs_more_tokens_than_it_saves_time_is_not_a_win(monkeypatch, tmp_path):
    # A fixed cost per step makes the 4x batch 1.2x the tokens/s (overhead 36.6 per-token costs, 128 tokens a step).
    s = _race(monkeypatch, tmp_path, ("eager", "batch"), StepClock(36.6e-5, 1e-5), batch_multiplier=4)
    _, batch = s.entries
    assert batch.tokens_per_s_prev == pytest.approx(1.2, rel=0.03)
    # It needs more tokens than its speed buys back: stopped at twice eager's time, before the target, where it
    # has trained 2.4x the tokens eager needed.
    assert batch.verdict == "loss" and batch.speedup_prev < 1 and batch.p_win == 1.0
    assert batch.token_ratio is None or batch.token_ratio > 1.2
    assert all(r.curve_tokens[-1] > 1.2 * b.tokens for r, b in zip(batch.own_runs, s.entries[0].runs) if not r.reached)
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
    assert "eager: seed 0 did not reach 0.0500 (time cap at 0.30 s, the race's time cap); its best val loss" in out
    assert "no configuration reached the target in every seed." in out


# -- bad input ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--target-loss", "nan"], "the target loss must be a positive finite number, got nan"),
    (["--target-loss", "-1"], "the target loss must be a positive finite number, got -1.0"),
    (["--target-loss", "inf"], "the target loss must be a positive finite number, got inf"),
    (["--seeds", "1"], "--seeds 1: the verdict is a test paired by seed, and needs at least 2 seeds"),
    (["--cap-factor", "1"], "--cap-factor 1: a run stops at this multiple of its base's time, so it must be above 1"),
    (["--cap-factor", "0.5"], "--cap-factor 0.5: a run stops at this multiple"),
    (["--batch-size", "600"], "too small for one batch of 600 x 32"),
    (["--combos", "eager+warp"], "unknown rung 'warp' in --combos"),
    (["--ladder", "warp"], "unknown ladder 'warp' (choose from source, speedrun, full)"),
    (["--ladder", "speedrun", "--rungs", "eager"], "give --ladder or --rungs, not both"),
    (["--target-from", str(DOCS / "example-cpu-results.json")], "is not a race: give a `speedladder race` folder"),
    (["--target-from", str(DOCS)], f"--target-from {DOCS}: no results.json there"),
    (["--target-from", str(DOCS), "--target-loss", "2"], "give --target-loss or --target-from, not both"),
])
def test_bad_race_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    assert main(["race", "--preset", "tiny", "--device", "cpu", *args, "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # refused before any run folder


def test_a_val_file_that_is_the_training_file_is_refused(tmp_path, capsys):
    """The same path, a link to it, or a copy (the same bytes): the val split would be trained on."""
    train = tmp_path / "train.bin"
    np.arange(20_000, dtype=np.uint16).tofile(train)
    (tmp_path / "link.bin").symlink_to(train)
    (tmp_path / "copy.bin").write_bytes(train.read_bytes())
    other = tmp_path / "other.bin"
    np.arange(20_000, dtype=np.uint16)[::-1].tofile(other)
    for val, why in ((train, "the same path"), (tmp_path / "link.bin", "the same file, through a link"),
                     (tmp_path / "copy.bin", "the same content: equal sha256")):
        assert main(["race", "--preset", "tiny", "--device", "cpu", "--data", str(train), "--val-data", str(val),
                     "--vocab-size", "20000", "--out", str(tmp_path / "runs")]) == 2
        err = capsys.readouterr().err.strip()
        assert f"--val-data {val} is the training data --data {train} ({why})" in err and len(err.splitlines()) == 1
    assert main(["race", "--preset", "tiny", "--device", "cpu", "--data", "timemachine", "--val-data", "timemachine",
                 "--out", str(tmp_path / "runs")]) == 2
    assert "(the same name)" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    work = prepare(RunConfig(preset="tiny", device="cpu", data=str(train), val_data=str(other), vocab_size=20_000))
    assert work.split.val_from == str(other)  # another file of the same size is a val split of its own


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
                 "--calibrate-steps", "60", "--eval-every-base-steps", "10", "--time-cap", "60", "--quiet",
                 "--out", str(out)]) == 0
    (run_dir,) = out.iterdir()
    return run_dir


@pytest.mark.slow
def test_the_race_is_saved_typed_and_complete(raced):
    from speedladder.racing.verdicts import capped_out
    from speedladder.records import storage

    saved = storage.load(raced)
    s = saved.race
    assert saved.kind == "race" and saved.status == "complete" and saved.rungs == []
    assert saved.corpus is not None and saved.corpus.val_from == "the last 10% of timemachine"
    assert saved.corpus.val_tokens == 17_058
    assert s.seeds == [0, 1, 2, 3] and s.target_from.startswith("eager fp32's val loss after 60 steps (seed 4)")
    assert s.target_loss == s.calibration.curve_val[-1] and s.calibration.curve_steps[-1] == 60
    assert s.time_cap_s == 60 and s.cap_from == "--time-cap" and s.cap_factor == 2.0
    assert s.budget_steps == 60 and s.budget_tokens == 60 * 4 * 32 and len(s.val_hash) == 16
    assert [e.name for e in s.entries] == ["eager", "bf16", "batch", "muon"]
    # Each is built on the last one before it that paid (won, or noise above 1.0x): what its stage raced it beside.
    for i, e in enumerate(s.entries[1:], 1):
        paid = [x.name for x in s.entries[:i] if x.built_upon]
        assert e.built_on == paid[-1] and s.stages[i - 1].names == [e.built_on, e.name]
        assert e.built_upon == (e.verdict == "win" or (e.verdict == "noise" and e.speedup_prev > 1))
    for e in s.entries:
        assert e.status == "ok" and e.causality.passed
        # Every seed, unless the rung was stopped at its cap in each of its first two: a loss, no more time spent.
        stopped_early = capped_out(e, s.entry(e.built_on), s.cap_factor) if e.built_on else False
        assert len(e.own_runs) == (2 if stopped_early else 4), (e.name, e.verdict_detail)
        assert e.verdict in ("baseline", "win", "loss", "noise", "not a win", "did not reach")
        assert not stopped_early or (e.verdict == "loss" and "was stopped there" in e.verdict_detail)
        assert e.budget is not None and len(e.budget.losses) == len(e.own_runs)
        for r in e.runs:
            assert r.curve_steps[0] == 0 and r.curve_seconds[0] == 0.0  # the curve starts before any training
            assert r.curve_seconds == sorted(r.curve_seconds) and r.eval_seconds > 0
            assert r.stage is not None and r.position in (0, 1) and r.cap_from
            if r.reached:
                i = r.curve_steps.index(r.first_eval_steps)
                assert r.curve_val[i] <= s.target_loss < min(v for v in r.curve_val[:i])
                assert r.curve_seconds[i - 1] <= r.seconds <= r.first_eval_seconds == r.curve_seconds[i]
                assert r.curve_tokens[-1] >= s.budget_tokens or r.train_seconds >= r.cap_s  # trained to the budget
    # The machine's load, read around every clocked stretch and judged over each run (measure/machine_load.py).
    m = saved.machine
    assert m is not None and m.windows == 0 and m.runs == sum(len(e.runs) for e in s.entries) > 0
    assert all(r.other_cores is not None and r.other_cores >= 0 for e in s.entries for r in e.runs)
    assert m.shared_runs == sum(r.shared for e in s.entries for r in e.runs)
    batch, muon = s.entry("batch"), s.entry("muon")
    assert batch.spec.batch_size == 8 and batch.changes_learning and batch.equal_tokens is not None
    assert muon.spec.optimizer == "muon" and muon.changes_learning
    judged = [e for e in s.entries if e.built_on]
    assert judged and all(e.p_win is not None and e.p_loss is not None and e.paired is not None for e in judged)


@pytest.mark.slow
def test_the_race_prints_and_draws_from_its_saved_file(raced, capsys):
    assert main(["report", str(raced)]) == 0
    out = capsys.readouterr().out
    assert "speedladder race · tiny" in out and "p win" in out and "s to target" in out
    assert "a one-sided t-test each way on their mean, paired by seed" in out and "modded-nanogpt's criterion" in out
    assert "stages: 1 bf16 against eager;" in out
    page = (raced / "report.html").read_text()
    assert 'id="race"' in page and 'id="chart-race-curves"' in page and "p loss" in page
    assert 'id="summary"' in page and "speedladder train --run RUN_DIR" in page
    assert (raced / "waterfall.png").stat().st_size > 10_000


def _by_hand(raced, scale: dict[str, float], **ruler) -> dict:
    """The saved race with every own run's time set by hand (reached), times `scale` for some configurations."""
    saved = json.loads((raced / "results.json").read_text())
    saved["race"].update(ruler)
    for e in saved["race"]["entries"]:
        for r in e["runs"]:
            r["stopped"] = "reached"
            r["seconds"] = (1.0 + 0.02 * r["seed"] * (-1) ** r["seed"]) * scale.get(e["name"], 1.0)
    return saved


@pytest.mark.slow
def test_compare_and_check_read_races(raced, tmp_path, capsys):
    assert main(["compare", str(raced), str(raced)]) == 0
    out = capsys.readouterr().out
    assert "race: seconds to the target val loss" in out and "WARNING" not in out
    assert main(["check", "--baseline", str(raced), "--against", str(raced)]) == 0
    assert "configuration(s) reached the target" in capsys.readouterr().out
    # Times set by hand, so that what is judged is the rule and not how busy the machine was during the race.
    for name, saved in (("base", _by_hand(raced, {})), ("slower", _by_hand(raced, {"bf16": 1.5}))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(saved))
    assert main(["check", "--baseline", str(tmp_path / "base"), "--against", str(tmp_path / "slower")]) == 1
    assert "check: regression: bf16: 1.50× the baseline's time to the target" in capsys.readouterr().out


@pytest.mark.slow
def test_races_on_different_rulers_are_refused_by_check_and_flagged_by_compare(raced, tmp_path, capsys):
    target = json.loads((raced / "results.json").read_text())["race"]["target_loss"]
    for name, ruler in (("target", {"target_loss": target + 0.01}), ("val", {"val_hash": "0" * 16}),
                        ("cadence", {"eval_tokens": 999})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(_by_hand(raced, {}, **ruler)))
        assert main(["compare", str(raced), str(tmp_path / name)]) == 0
        out = capsys.readouterr().out
        assert "WARNING: races A and B were measured on different rulers (" in out
        assert main(["check", "--baseline", str(raced), "--against", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert "the races were measured on different rulers (" in err and len(err.splitlines()) == 1
        said = {"target": f"target {target:.4f} vs {target + 0.01:.4f}", "val": f"vs {'0' * 16}",
                "cadence": "eval every 1,280 tokens vs 999 tokens"}[name]
        assert said in out and said in err


@pytest.mark.slow
def test_target_from_races_on_a_saved_races_ruler(raced, tmp_path, capsys):
    saved = json.loads((raced / "results.json").read_text())["race"]
    # Its eval cadence is that race's (evaluations every 10): another is refused, as below.
    assert main(["race", "--preset", "tiny", "--device", "cpu", "--rungs", "eager", "--seeds", "2",
                 "--eval-every-base-steps", "20", "--target-from", str(raced), "--out", str(tmp_path / "cadence")]) == 2
    assert "(eval every 1,280 tokens vs 2,560 tokens)" in capsys.readouterr().err
    assert main(["race", "--preset", "tiny", "--device", "cpu", "--rungs", "eager", "--seeds", "2",
                 "--eval-every-base-steps", "10", "--target-from", str(raced), "--calibrate-steps", "20", "--quiet",
                 "--out", str(tmp_path)]) == 0
    (run_dir,) = tmp_path.iterdir()
    again = json.loads((run_dir / "results.json").read_text())["race"]
    assert again["target_loss"] == saved["target_loss"] and again["calibration"] is None
    assert again["target_from"].startswith(f"the target of {raced} (eager fp32's val loss after 60 steps")
    assert again["val_hash"] == saved["val_hash"] and again["config"]["target_loss"] == saved["target_loss"]
    capsys.readouterr()
    # Another val set (fewer windows): another ruler, refused before anything is measured.
    assert main(["race", "--preset", "tiny", "--device", "cpu", "--val-sequences", "32",
                 "--eval-every-base-steps", "10", "--target-from", str(raced), "--out", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err.strip()
    assert "that race was measured on another ruler (val set" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "other").exists()


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
    assert s.entry("bf16+muon").spec.optimizer == "muon" and s.entry("bf16+muon").changes_learning
    assert all(len(e.runs) == 2 for e in s.entries) and saved.status == "complete"
    (run_dir,) = tmp_path.iterdir()
    assert {"results.json", "waterfall.png", "report.html"} <= {p.name for p in run_dir.iterdir()}


@pytest.mark.slow
def test_check_re_runs_a_race_with_its_own_configuration(raced):
    """The race's config.toml, and what check rebuilds from its results.json, are the race that was run."""
    from speedladder import codec
    from speedladder.cli.cmd_check import rerun_settings
    from speedladder.config import settings

    saved = json.loads((raced / "results.json").read_text())
    command, again = rerun_settings(saved)
    written = codec.from_data(settings.Settings, settings.read(raced / "config.toml"))
    # The race again, on the baseline's ruler: its target, not one calibrated again on another machine.
    assert command == "race" and again.run == written.run
    assert again.race == dataclasses.replace(written.race, target_loss=saved["race"]["target_loss"])
    race = again.race
    assert race.rungs == ("eager", "bf16", "batch", "muon") and again.run.rungs == race.rungs
    assert (again.run.preset, again.run.batch_size, again.run.seq_len, again.run.seed) == ("tiny", 4, 32, 0)
    assert (race.seeds, race.calibrate_steps, race.eval_every, race.time_cap_s) == (4, 60, 10, 60.0)


def test_memory_handed_back_before_a_run_is_faulted_in_again_off_the_clock(monkeypatch, tmp_path):
    """Each run hands freed memory back to the system, then takes one untimed step (on a stream no run draws from)
    and restores the weights: the pages the steps need are faulted in before the clock starts, not on it."""
    from speedladder.measure import devicemem

    events: list[str] = []
    monkeypatch.setattr(devicemem, "return_host_memory", lambda: events.append("trim"))

    class Recording(StepClock):
        def start(self) -> None:
            events.append("clock")

    work = prepare(RunConfig(preset="tiny", device="cpu"))
    race = Race(work, tmp_path, RACE, clock=Recording(0.0, 1e-5))
    step = work.step(work.base_spec)
    calls = []
    real = type(step).__call__

    def recorded(self, x, y):
        events.append("step")
        calls.append(x)
        return real(self, x, y)

    monkeypatch.setattr(type(step), "__call__", recorded)
    run = race.train_to(step, 0, -math.inf, None, max_steps=10)
    assert events[:3] == ["trim", "step", "clock"]  # handed back, a warm step, and only then the clock
    assert len(calls) == 11 and not torch.equal(calls[0], calls[1])  # the warm step's batch is not the run's first
    monkeypatch.setattr(type(step), "__call__", real)
    monkeypatch.setattr(Race, "_warm", lambda self, step, init: None)
    cold = race.train_to(work.step(work.base_spec), 0, -math.inf, None, max_steps=10)
    # The warm step left the run as it was: the same weights and batches, the same curve as a run without it.
    assert run.curve_val == cold.curve_val and run.curve_train == cold.curve_train and run.curve_train[-1] is not None


@pytest.mark.slow
def test_a_race_folder_names_its_fastest_for_train_and_apply(raced):
    from speedladder.records import storage
    from speedladder.train.winner import winner

    saved = storage.load(raced)
    best = saved.race.entry(saved.race.fastest)
    assert saved.winner() == (best.name, tuple(n for n in best.rungs if n != "eager"))
    spec, _ = winner(raced, torch.device("cpu"))
    assert spec == best.spec
