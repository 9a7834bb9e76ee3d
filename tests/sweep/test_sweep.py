"""The sweep: its crossover logic on synthetic verdicts, its points' configurations, and one small run end to end."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from conftest import resolved

from speedladder.cli import main
from speedladder.config.resolved import resolve
from speedladder.config.run import RunConfig
from speedladder.errors import UsageError
from speedladder.records import Environment, Results, RungResult, SavedModel, from_dict, to_dict
from speedladder.records.sweep_section import SweepPoint, SweepRung, SweepSection
from speedladder.step.workload import prepare
from speedladder.sweep.axis import crossover_line, crossovers, estimate, point_config, summarize

W = [64, 128, 256, 512]


def test_a_loss_that_turns_into_a_win_is_a_crossover_between_the_two_points():
    (c,) = crossovers(W, ["loss", "loss", "win", "win"])
    assert (c["from"], c["to"], c["after"], c["before"], c["inconclusive"]) == ("loss", "win", 128, 256, [])


def test_a_win_that_turns_into_a_loss_is_named_the_other_way():
    (c,) = crossovers(W[:3], ["win", "loss", "loss"])
    assert (c["from"], c["to"], c["after"], c["before"]) == ("win", "loss", 64, 128)
    assert len(crossovers(W, ["loss", "win", "loss", "win"])) == 3


def test_no_crossover_in_range_says_why():
    assert crossovers(W, ["win"] * 4) == []
    assert "win at every point" in crossover_line("bf16", "width", W, ["win"] * 4)
    assert "loss at every point" in crossover_line("bf16", "width", W, ["loss"] * 4)
    assert "no conclusive point" in crossover_line("bf16", "width", W, ["noise", None, "noise", "noise"])
    # A win after noise is not a turn from a loss: no crossover, and the verdicts are listed.
    line = crossover_line("bf16", "width", W, ["noise", "noise", "win", "win"])
    assert crossovers(W, ["noise", "noise", "win", "win"]) == [] and "64: noise" in line and "512: win" in line


def test_inconclusive_points_between_a_loss_and_a_win_widen_the_crossover():
    # Overlapping windows (noise) and a point that failed its gate or was not measured (None) decide nothing.
    (c,) = crossovers(W, ["loss", "noise", None, "win"])
    assert (c["after"], c["before"], c["inconclusive"]) == (64, 512, [128, 256])
    line = crossover_line("compile", "width", W, ["loss", "noise", None, "win"])
    assert "64 and 512" in line and "128, 256" in line
    assert crossovers(W, ["loss", "noise", "noise", "noise"]) == []


def test_summary_reads_each_rungs_verdicts_from_the_points():
    points = [SweepPoint(value=v, dir=f"width-{v}", status="complete", model={}, batch_size=2, seq_len=8,
                         rungs={"eager": SweepRung("ok"), "bf16": SweepRung("ok", verdict=verdict)})
              for v, verdict in zip(W, ["loss", "noise", "win", "win"])]
    s = summarize("width", points, ("eager", "bf16"))
    assert list(s) == ["bf16"] and s["bf16"].verdicts == ["loss", "noise", "win", "win"]
    assert s["bf16"].crossovers[0].after == 64 and s["bf16"].crossovers[0].before == 256


def test_each_axis_changes_one_thing_and_keeps_the_head_size():
    base = resolve(RunConfig(preset="d2l-cpu", device="cpu"), torch.device("cpu"))  # width 128, 4 heads of 32
    run = point_config(base, "width", 256, ("eager", "bf16", "compile"))
    assert run.model_changes == {"n_embd": 256, "n_head": 8, "mlp_hidden": 1024}
    assert run.rungs == ("eager",) and run.beside == ("bf16", "compile")
    assert run.gates.learns_steps == 0 and not run.profile.enabled
    assert resolve(run, torch.device("cpu")).model.head_dim == base.model.head_dim
    assert point_config(base, "layers", 4, ("eager",)).model_changes == {"n_layer": 4}
    seq = point_config(base, "seq_len", 128, ("eager",))
    assert seq.seq_len == 128 and seq.model_changes == {"block_size": 128}
    assert resolve(seq, torch.device("cpu")).seq_len == 128
    assert point_config(base, "batch_size", 32, ("eager",)).batch_size == 32
    with pytest.raises(UsageError):
        point_config(base, "width", 100, ("eager",))  # not a multiple of the head size
    theirs = dataclasses.replace(base, model=None)  # a Hugging Face or user model: only the batch can vary
    assert point_config(theirs, "batch_size", 32, ("eager",)).batch_size == 32
    with pytest.raises(UsageError):
        point_config(theirs, "width", 256, ("eager",))


def _folder(out: Path) -> Path:
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return folder


@pytest.mark.slow
def test_sweep_end_to_end_prints_plots_and_saves_the_curve(tmp_path, capsys):
    rc = main(["sweep", "--widths", "32,16", "--sweep-rungs", "eager,bf16", "--preset", "tiny", "--device", "cpu",
               "--window-steps", "2", "--no-process-peak", "--out", str(tmp_path)])
    assert rc == 0
    folder = _folder(tmp_path)
    res = json.loads((folder / "results.json").read_text())
    s = res["sweep"]
    assert res["kind"] == "sweep" and res["status"] == "complete"
    assert s["axis"] == "width" and s["values"] == [16, 32] and [p["value"] for p in s["points"]] == [16, 32]
    for p in s["points"]:
        bf16 = p["rungs"]["bf16"]
        assert p["model"]["n_embd"] == p["value"] and p["model"]["n_embd"] // p["model"]["n_head"] == 16
        assert bf16["verdict"] in ("win", "loss", "noise") and bf16["x_lo"] <= bf16["x"] <= bf16["x_hi"]
        assert (folder / p["dir"] / "results.json").exists()  # each point is a ladder folder of its own
    assert "bf16" in s["summary"] and s["summary"]["bf16"]["verdicts"] == [p["rungs"]["bf16"]["verdict"]
                                                                           for p in s["points"]]
    out = capsys.readouterr().out
    assert f"{s['points'][0]['rungs']['bf16']['x']:.2f}×" in out and s["summary"]["bf16"]["line"] in out
    assert (folder / "sweep.png").stat().st_size > 0 and (folder / "report.html").stat().st_size > 0
    assert main(["report", str(folder)]) == 0


def test_a_budget_that_is_spent_starts_no_more_points(tmp_path):
    rc = main(["sweep", "--batch-sizes", "2,4", "--sweep-rungs", "eager", "--preset", "tiny", "--device", "cpu",
               "--window-steps", "2", "--no-process-peak", "--budget-minutes", "0.0001", "--quiet",
               "--out", str(tmp_path)])
    assert rc == 0
    s = json.loads((_folder(tmp_path) / "results.json").read_text())["sweep"]
    assert s["points"] == [] and [k["value"] for k in s["skipped"]] == [2, 4]


def test_the_next_points_time_is_the_last_ones_compile_plus_the_rest_scaled_by_the_work(tiny):
    bigger = prepare(RunConfig(preset="tiny", device="cpu", batch_size=8))  # twice the tokens of tiny's B=4
    prev = Results(schema="", status="complete", created="", command=[], config=resolved(), environment=Environment(), model=SavedModel(),
                   rungs=[RungResult(name=n, rung=n, role="rung", reason="", kind="speed", built_on=None,
                                     spec=tiny.base_spec, precision="fp32", requirement={}, wall_s=5.0, compile_s=c)
                          for n, c in (("eager", None), ("compile", 4.0))])
    assert estimate(prev, tiny, bigger) == pytest.approx(4.0 + (10.0 - 4.0) * 2)


def test_bad_sweep_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["sweep", "--widths", "64,100", "--preset", "d2l-cpu", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert main(["sweep", "--widths", "64,64", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert main(["sweep", "--layers", "2", "--budget-minutes", "0", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert main(["sweep", "--widths", "64", "--layers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("speedladder: error:") == 4 and "Traceback" not in err
    assert "one axis at a time: --widths and --layers" in err


def test_a_saved_sweep_section_reads_as_records_and_writes_back_in_the_same_shape():
    """The sweep's section as the sweep wrote it before its records: x only where measured, a turn's "from"."""
    saved = {"axis": "width", "values": [64, 128], "rungs": ["eager", "bf16"], "budget_minutes": 10.0,
             "points": [{"value": v, "dir": f"width-{v}", "status": "complete", "model": {"n_embd": v, "n_layer": 2},
                         "batch_size": 2, "seq_len": 8,
                         "rungs": {"eager": {"status": "ok", "detail": "", "verdict": None, "passed": True,
                                             "tokens_per_s": {"median": 10.0, "min": 9.0, "max": 11.0},
                                             "saved_activation_bytes": None},
                                   "bf16": {"status": "ok", "detail": "", "verdict": verdict, "passed": True,
                                            "tokens_per_s": {"median": 12.0, "min": 11.0, "max": 13.0},
                                            "saved_activation_bytes": None, "x": 1.2, "x_lo": 1.0, "x_hi": 1.44}}}
                        for v, verdict in ((64, "loss"), (128, "win"))],
             "skipped": [], "seconds": 12.5,
             "summary": {"bf16": {"verdicts": ["loss", "win"], "line": "bf16: turns",
                                  "crossovers": [{"from": "loss", "to": "win", "after": 64, "before": 128,
                                                  "inconclusive": []}]}}}
    section = from_dict(SweepSection, saved)
    assert section.points[0].rungs["eager"].x is None and section.points[1].rungs["bf16"].x == 1.2
    assert section.summary["bf16"].crossovers[0].start == "loss"
    assert to_dict(section) == saved
