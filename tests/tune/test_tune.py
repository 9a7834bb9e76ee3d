"""`speedladder tune`: its selection logic on a fake set of measured results, then the command end to end."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import resolved

from speedladder import codec, report
from speedladder.cli import main
from speedladder.config import settings
from speedladder.config.resolved import resolve
from speedladder.config.run import RunConfig
from speedladder.config.settings import Settings
from speedladder.records import Environment, Gate, Results, RungResult, SavedModel, storage
from speedladder.rungs import RUNGS, Env, Requirement
from speedladder.spec import StepSpec
from speedladder.tune import search


def rung(name, verdict="win", prev=1.2, status="ok", passed=True, role="rung", built_on="eager", detail="",
         **extra) -> RungResult:
    r = RungResult(name=name, rung=name, role=role, reason="", kind="speed", built_on=built_on,
                   spec=StepSpec(4, 32), precision="fp32", requirement={}, status=status, detail=detail, **extra)
    if status == "ok":
        r.verdict, r.speedup_prev = verdict, prev
        r.gate = Gate(passed=passed, detail="" if passed else "logits differ")
    return r


def results_of(rungs: list[RungResult], fastest: str | None = None) -> Results:
    return Results(schema="speedladder.results/2", status="complete", created="", command=[], config=resolved(),
                   environment=Environment(), model=SavedModel(), rungs=rungs, fastest=fastest)


def fake() -> Results:
    return results_of([
        rung("eager", verdict="baseline", prev=None, built_on=None),
        rung("compile", prev=1.5),
        rung("bf16", verdict="noise", prev=1.01, built_on="compile"),
        rung("sdpa", prev=1.1, built_on="compile"),
        rung("fused-adamw", verdict="loss", prev=0.9, built_on="sdpa"),
        rung("pad-vocab", prev=1.3, built_on="sdpa", passed=False),
        rung("batch", prev=1.4, built_on="sdpa"),
        rung("batch-fp32", verdict="control", role="control", built_on="batch"),
        rung("max-autotune", status="skipped", detail="needs cuda; this device is cpu"),
        rung("fp8", status="oom", detail="CUDA out of memory"),
        rung("ckpt", prev=1.05, role="beside", built_on="batch"),
        rung("slow", verdict="short", prev=0.08, built_on="batch"),  # one window, as predicted: never gated
    ])


def test_survivors_are_the_rungs_that_won_and_passed():
    assert search.survivors(fake()) == ("compile", "sdpa", "batch", "ckpt")
    gone = search.dropped(fake())
    assert set(gone) == {"bf16", "fused-adamw", "pad-vocab", "max-autotune", "fp8", "slow"}
    assert gone["bf16"] == "noise: 1.01×, inside the spread of compile"
    assert gone["fused-adamw"] == "loss: 0.90×, below sdpa"
    assert gone["pad-vocab"] == "failed a gate: logits differ"
    assert gone["max-autotune"] == "skipped: needs cuda; this device is cpu"
    assert gone["fp8"] == "oom: CUDA out of memory"
    assert gone["slow"] == "short: 0.08× batch in one window, as predicted"


def test_candidates_combine_the_survivors_then_leave_each_out_smallest_gain_first():
    cands = search.candidates(fake(), limit=10)
    assert cands[0] == ("tuned", ("compile", "sdpa", "batch", "ckpt"))
    assert [name for name, _ in cands[1:]] == ["tuned-no-ckpt", "tuned-no-sdpa", "tuned-no-batch", "tuned-no-compile"]
    assert cands[1][1] == ("compile", "sdpa", "batch")
    assert len(search.candidates(fake(), limit=2)) == 2
    nothing_won = results_of([rung("eager", verdict="baseline", built_on=None), rung("compile", verdict="noise")])
    assert search.survivors(nothing_won) == () and search.candidates(nothing_won, 4) == []


def test_the_winner_and_the_commands_that_reproduce_it():
    res = fake()
    res.rungs.append(rung("tuned", role="candidate", rungs_combined=["compile", "sdpa", "batch"]))
    res.fastest = "tuned"
    assert search.winner(res).name == "tuned"
    assert search.rungs_of(search.winner(res), res) == ("compile", "sdpa", "batch")
    # A ladder rung's configuration is its chain of rungs from eager.
    assert search.rungs_of(res.rung("batch"), res) == (
        "eager", "compile", "sdpa", "batch")
    cmds = search.commands("runs/x")
    assert cmds.run == "speedladder run --config runs/x/winner.toml"
    assert cmds.train == "speedladder train --config runs/x/winner.toml"
    assert cmds.apply == 'model, optimizer, autocast, spec = speedladder.apply(model, "runs/x/winner.toml")'
    cfg = resolve(RunConfig(preset="tiny"), torch.device("cpu"))
    won = search.winner_settings(Settings(), cfg.run, ("compile", "sdpa", "batch"))
    assert won.run.rungs == ("eager", "compile", "sdpa", "batch") and won.train.rungs == ("compile", "sdpa", "batch")
    assert (won.run.preset, won.run.batch_size, won.run.ladder, won.run.beside) == ("tiny", 4, None, ())


def test_budget_refuses_work_that_would_not_fit():
    won = results_of([rung("eager", verdict="baseline", built_on=None, wall_s=30.0),
                      rung("compile", prev=1.5, wall_s=30.0)])
    assert search.Budget(100, won, reserve=1).reason() is None  # 100 s left >= 2 x 30 s
    late = search.Budget(50, won, reserve=1)
    assert late.reason().startswith("not started: the tune budget has 50 s left and a rung takes about 30 s")
    assert search.Budget(50, won, reserve=0).reason() is None
    # Nothing has won yet: no combination to keep time for.
    lost = results_of([won.rungs[0], rung("compile", verdict="loss", prev=0.5, wall_s=30.0)])
    assert search.Budget(50, lost, reserve=1).reason() is None
    assert search.Budget(20, lost, reserve=1).reason() is not None


def test_the_race_takes_the_fastest_by_tokens_per_s_and_the_batch_axis_under_each_rule():
    res = fake()
    res.rungs.append(rung("tuned", role="candidate", prev=1.8, rungs_combined=["compile", "sdpa", "batch"]))
    for r in res.rungs:
        r.speedup_cum = r.speedup_prev
    res.fastest = "tuned"
    base = StepSpec(4, 32)
    configs = search.race_configs(res, 3, Env("cpu", None, 4), base)
    names = [c.name for c in configs]
    # The tokens/s winner first; the batch axis: the fastest with batch (tuned, the winner) under each rule, and
    # without batch (compile+sdpa); then the next fastest by tokens/s, to 3 finalists with the winner (the batch
    # rung's and sdpa's configurations are tuned's and tuned-no-batch's, raced already).
    assert names == ["tuned", "tuned@lr-sqrt", "tuned@lr-linear", "tuned-no-batch", "compile", "ckpt"]
    by = {c.name: c for c in configs}
    assert by["tuned"].spec.batch_size == 16 and by["tuned"].spec.lr_scale == 1.0
    assert by["tuned@lr-sqrt"].spec.lr_scale == 2.0 and by["tuned@lr-linear"].spec.lr_scale == 4.0
    assert by["tuned@lr-sqrt"].batch_lr_scale == "sqrt" and by["tuned-no-batch"].spec.batch_size == 4
    assert len({json.dumps(c.spec.to_dict(), sort_keys=True) for c in configs}) == len(configs)  # distinct


def _raced(name: str, seconds: list[float], built_on: str | None = "eager"):
    from speedladder.records import RaceEntry, RaceRun

    runs = [RaceRun(i, "reached", seconds=t, train_seconds=t, tokens=100.0, stage=1, curve_tokens=[0, 100],
                    curve_val=[3.0, 2.0], curve_seconds=[0.0, t], curve_steps=[0, 10]) for i, t in enumerate(seconds)]
    return RaceEntry(name, [] if name == "eager" else name.split("+"), "finalist", "", "speed", built_on,
                     StepSpec(4, 32).to_dict(), "fp32", status="ok", stage=1, runs=runs)


def test_the_time_judge_refuses_a_batch_up_faster_per_token_but_slower_to_the_target():
    """The tokens/s judge's winner is the batch-up (2x eager's tokens/s); raced, it reaches the target later than
    eager. The time judge names bf16, and keeps both answers."""
    from speedladder.racing import judge, versus
    from speedladder.records import RaceSection, TuneJudge, TuneSection

    race = RaceSection(target_loss=2.0, alpha=0.01, seeds=[0, 1, 2, 3], entries=[
        _raced("eager", [10.0, 10.4, 9.8, 10.1], None), _raced("bf16+batch", [14.0, 14.9, 13.8, 14.2]),
        _raced("bf16", [5.1, 5.3, 5.0, 5.2])])
    judge(race)
    assert race.entry("bf16+batch").verdict == "loss" and race.entry("bf16").verdict == "win"
    section = TuneSection(winner="bf16+batch", winner_rungs=["bf16", "batch"],
                          tokens_judge=TuneJudge("tokens", "bf16+batch", ["bf16", "batch"], tokens_per_s_x=2.0))
    configs = [search.Raced("bf16+batch", ("bf16", "batch"), StepSpec(16, 32), "none", "bf16+batch", 2.0),
               search.Raced("bf16", ("bf16",), StepSpec(4, 32, autocast="bf16"), "none", "bf16", 1.6)]
    search.judge_by_time(section, race, configs, results_of([]),
                       lambda name: versus(race.entry(name), race.entry("bf16+batch"), 0.01).p_less)
    assert (section.judge, section.winner, section.winner_rungs) == ("time", "bf16", ["bf16"])
    t = section.time_judge
    assert t.time_x == pytest.approx(race.entry("bf16").speedup_cum) and t.p_vs_eager < 0.01 and t.p_vs_other < 0.01
    assert section.tokens_judge.winner == "bf16+batch" and section.tokens_judge.time_x < 1  # kept, and refused
    # Nothing beats eager to the target: eager is the time judge's winner.
    race.entries[2].runs = [dataclasses.replace(r, seconds=r.seconds * 2.2, train_seconds=r.seconds * 2.2)
                            for r in race.entries[2].runs]
    judge(race)
    search.judge_by_time(section, race, configs, results_of([]))
    assert section.winner == "eager" and section.winner_rungs == [] and "faster than eager" in section.time_judge.detail


@pytest.fixture
def no_compile(monkeypatch):
    """Keep the end-to-end tests fast: the compile rung is skipped as if no compiler were here."""
    monkeypatch.setitem(RUNGS, "compile", dataclasses.replace(RUNGS["compile"], requires=Requirement(devices=("cuda",))))


TUNE = ["tune", "--preset", "tiny", "--device", "cpu", "--window-steps", "3", "--budget-minutes", "3",
        "--max-candidates", "1", "--windows", "3", "--loss-steps", "4", "--learns-steps", "60", "--no-profile",
        "--no-process-peak"]


@pytest.mark.slow
def test_tune_end_to_end(tmp_path, capsys, no_compile):
    rc = main([*TUNE, "--race-finalists", "2", "--calibrate-steps", "30", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    (path,) = tmp_path.glob("*/results.json")
    res = json.loads(path.read_text())
    t = res["tune"]
    assert res["config"]["ladder"] == "full" and res["config"]["beside"] == ["ckpt"]
    # tune takes run's gate, profile and memory flags
    assert res["config"]["gates"]["learns_steps"] == 60 and res["config"]["gates"]["loss_steps"] == 4
    assert not res["config"]["profile"]["enabled"] and not res["config"]["memory"]["process_peak"]
    assert res["learns_check"]["steps"] == 60 and res["profile"] is None
    winner_toml = path.parent / "winner.toml"
    assert t["commands"]["run"] == f"speedladder run --config {winner_toml}"
    won = codec.from_data(Settings, settings.read(winner_toml))  # judged as tune judged it
    assert won.run.gates.learns_steps == 60 and won.run.gates.loss_steps == 4
    assert won.run.rungs == ("eager", *t["winner_rungs"]) and won.train.rungs == tuple(t["winner_rungs"])
    assert t["dropped"]["compile"] == "skipped: needs cuda; this device is cpu"
    assert set(t["survivors"]) | set(t["dropped"]) == {n for n in res["config"]["rungs"] if n != "eager"} | {"ckpt"}
    assert res["learns_check"]["passed"]
    # The climb builds on the best estimate (docs/measurement.md, rule 13): each rung on the last below it that
    # passed and, for a speed rung, was a win or noise above 1.0x; a claim (tune's survivors) needs a win.
    last = "eager"
    for r in [r for r in res["rungs"] if r["role"] == "rung"][1:]:
        assert r["built_on"] == last, (r["name"], r["built_on"], last)
        above = r["verdict"] == "win" or (r["verdict"] in ("noise", "inconclusive") and r["speedup_prev"] > 1)
        if r["status"] == "ok" and r["gate"]["passed"] and (r["kind"] != "speed" or above):
            last = r["name"]
        assert bool(r["not_built_upon"]) == (r["status"] == "ok" and r["gate"]["passed"] and last != r["name"])
    assert all(next(r for r in res["rungs"] if r["name"] == n)["verdict"] == "win" for n in t["survivors"])
    # Two judges: tokens/s names the fastest in windows; the race names the winner by the time to the target.
    assert t["tokens_judge"]["winner"] == res["fastest"] and t["judge"] == "time" and won.tune.judge == "time"
    race = t["race"]
    assert race["target_loss"] is not None and race["entries"][0]["name"] == "eager" and len(race["seeds"]) == 4
    raced = {e["name"]: e for e in race["entries"]}
    assert res["fastest"] in raced and len(raced) >= 2 and all(e["stage"] == 1 for e in raced.values())
    assert t["winner"] in raced and t["time_judge"]["winner"] == t["winner"]
    assert t["winner_spec"] == raced[t["winner"]]["spec"]
    if t["winner"] != "eager":
        assert raced[t["winner"]]["verdict"] == "win" and t["time_judge"]["p_vs_eager"] < 0.01
    header = [line for line in winner_toml.read_text().splitlines() if line.startswith("#")]
    assert header[0].startswith(f"# tune's winner ({t['winner']}) from {path.parent}, chosen by the time to the target")
    assert any(line.startswith("# the time judge: ") for line in header)
    assert any(line.startswith(f"# the tokens judge: {res['fastest']} ") for line in header)
    assert f"speedladder train --config {winner_toml}" in out and t["commands"]["run"] in out
    assert 'speedladder.apply(model, "' + str(winner_toml) + '")' in out
    assert "tune: the winning configuration" in out and "tune: the time judge names" in out
    assert "speedladder race · tiny" in out  # the race's table
    cands = [r for r in res["rungs"] if r["role"] == "candidate"]
    assert len(cands) + sum(1 for c in t["candidates"] if c.get("same_as")) == len(t["candidates"]) <= 1
    assert report.tune_lines(storage.load(path.parent))[0] in out  # the saved file is what was printed
    page = (path.parent / "report.html").read_text()  # tune leaves the page as run does
    assert 'id="rungs"' in page and t["winner"] in page and f"report: {path.parent / 'report.html'}" in out
    assert 'id="chart-race-curves"' in page and 'class="summary"' in page
    # tune -> winner.toml -> train --config winner.toml trains the winner
    assert main(["train", "--config", str(winner_toml), "--steps", "4", "--eval-every", "2", "--sample-tokens", "0",
                 "--out", str(tmp_path / "trained")]) == 0
    trained = capsys.readouterr().out
    assert f"with --compose {','.join(t['winner_rungs']) or 'eager'}" in trained and "step 4, loss" in trained
    (ckpt,) = (tmp_path / "trained").glob("*/checkpoint.pt")
    saved_spec = torch.load(ckpt, weights_only=True)["spec"]
    assert {k: saved_spec[k] for k in ("batch_size", "lr_scale")} == {k: t["winner_spec"][k]
                                                                     for k in ("batch_size", "lr_scale")}


@pytest.mark.slow
def test_tune_judged_by_tokens_races_nothing(tmp_path, capsys, no_compile):
    assert main([*TUNE, "--judge", "tokens", "--quiet", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*/results.json")
    res = json.loads(path.read_text())
    t = res["tune"]
    assert t["judge"] == "tokens" and t["race"] is None and t["time_judge"] is None
    assert t["winner"] == res["fastest"] and t["tokens_judge"]["winner"] == res["fastest"]
    assert t["winner_spec"] == next(r["spec"] for r in res["rungs"] if r["name"] == t["winner"])
    assert "chosen by tokens/s in timed windows (--judge tokens)" in (path.parent / "winner.toml").read_text()
