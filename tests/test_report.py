"""The table, notes and waterfall read nothing but saved results (typed records)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import resolved

from speedladder import report, results
from speedladder.cli import main
from speedladder.measure import Spread
from speedladder.records import Gate, Results, RungResult, from_dict, to_dict

COLOURS = report.COLOURS
EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "example-cpu-results.json"
# The saved example of 2026-11-29 (schema 1, before the codec), kept as it was written: old files must still load.
SCHEMA_1 = Path(__file__).resolve().parent / "data" / "results-schema1.json"


def rung(name, median, spread=0.02, verdict="win", built_on=None, role="rung", status="ok", passed=True, **kw):
    r = RungResult(name=name, rung=kw.pop("rung", name), role=role, reason="", kind="speed", built_on=built_on,
                   spec={"batch_size": kw.pop("batch_size", 64)}, precision=kw.pop("precision", "fp32"),
                   requirement={}, status=status, detail=kw.pop("detail", ""))
    if status == "ok":
        r.tokens_per_s = Spread(median, median * (1 - spread), median * (1 + spread))
        r.step_ms, r.peak_memory_bytes, r.mfu, r.tflops = 10.0, kw.pop("mem", 2**30), 0.5, 100.0
        r.timing = {"cache_hits": 0}
        r.gate = Gate(passed=passed, detail="" if passed else "logits differ")
        r.verdict, r.speedup_prev, r.speedup_cum = verdict, kw.pop("prev", None), kw.pop("cum", 1.0)
    return r


def make(rungs, fastest=None) -> Results:
    return Results(schema=results.SCHEMA, status="complete", created="2026-11-29T00:00:00+00:00", command=["x"],
                   config=resolved(preset="d2l-512", batch_size=64, seq_len=128),
                   environment={"device_name": "NVIDIA H200", "device_type": "cuda", "torch": "2.11.0"},
                   model={}, corpus={"source": "timemachine"}, rungs=rungs, fastest=fastest)


def example() -> Results:
    return make([
        rung("eager", 100_000, verdict="baseline"),
        rung("compile", 130_000, built_on="eager", prev=1.3, cum=1.3),
        rung("bf16", 129_000, built_on="compile", verdict="noise", prev=0.99, cum=1.29, precision="bf16"),
        rung("batch", 200_000, built_on="bf16", prev=1.55, cum=2.0, precision="bf16", batch_size=512, mem=8 * 2**30),
        rung("batch-fp32", 0, role="control", rung="batch", status="oom", detail="CUDA out of memory"),
        rung("ckpt", 180_000, built_on="batch", verdict="loss", prev=0.9, cum=1.8, passed=False),
        rung("fp8", 0, status="skipped", detail="needs CUDA compute capability >= 8.9; this GPU is 8.0"),
    ], fastest="batch")


def test_rows_show_the_saved_numbers():
    rows = {r["rung"]: r for r in report.rows(example())}
    assert rows["compile"]["tokens/s"] == "130,000"
    assert rows["compile"]["× prev"] == "1.30×" and rows["compile"]["× cum"] == "1.30×"
    assert rows["compile"]["MFU"] == "50.0%" and rows["compile"]["peak mem"] == "1.00 GiB"
    assert rows["eager"]["× prev"] == "—" and rows["eager"]["compile s"] == "—"
    assert rows["ckpt"]["gate"] == "FAIL" and rows["ckpt"]["verdict"] == "failed (loss)"
    assert rows["└ batch fp32 control"]["verdict"] == "OOM"
    assert rows["fp8"]["verdict"] == "skipped" and rows["fp8"]["tokens/s"] == "—"


def test_notes_name_each_skip_failure_and_control():
    by_rung = {}
    for line in report.notes(example()):
        by_rung.setdefault(line.split(":")[0], []).append(line)
    # One note per thing to explain, carrying the saved reason.
    assert any("needs CUDA compute capability >= 8.9" in n for n in by_rung["fp8"])
    assert any("logits differ" in n for n in by_rung["ckpt"])
    assert any("out of memory" in n and "B=512" in n for n in by_rung["batch"])
    (fastest,) = [n for n in report.notes(example()) if n.startswith("fastest")]
    assert "batch" in fastest and "2.00×" in fastest and "200,000" in fastest


def test_reserved_memory_windows_and_the_fp8_peak_are_shown_beside_the_saved_numbers():
    res = example()
    cudagraphs = rung("cudagraphs", 210_000, built_on="batch", prev=1.05, cum=2.1, precision="bf16", mem=8 * 2**30)
    cudagraphs.peak_reserved_bytes = 12 * 2**30  # the graphs' pool: reserved, never allocated again
    cudagraphs.timing = {"cache_hits": 0, "window_steps": 240, "sized_from_step_s": 0.0021, "min_window_s": 0.5}
    fp8 = rung("fp8", 220_000, built_on="cudagraphs", prev=1.05, cum=2.2, precision="fp8")
    fp8.peak_tflops, fp8.peak_basis = 1409.35, "fp8's peak for the block linears' 60% of the FLOPs, bf16's for the rest"
    res.rungs[5:] = [cudagraphs, fp8]
    rows = {r["rung"]: r for r in report.rows(res)}
    assert rows["cudagraphs"]["peak mem"] == "8.00 GiB (res 12.0 GiB)"
    assert rows["batch"]["peak mem"] == "8.00 GiB"  # nothing reserved on record: nothing shown
    notes = report.notes(res)
    assert "fp8: MFU against 1,409 TFLOP/s, fp8's peak for the block linears' 60% of the FLOPs, bf16's for the rest." in notes
    assert any(n.startswith("windows: steps per window sized from a timed warm-up step so that a window lasts at "
                            "least 0.5 s: cudagraphs 240") for n in notes)


def test_control_note_compares_speed_and_memory():
    res = example()
    res.rungs[4] = rung("batch-fp32", 100_000, role="control", rung="batch", built_on="batch", mem=16 * 2**30,
                        verdict="control")
    (note,) = [n for n in report.notes(res) if n.startswith("batch:")]
    for number in ("2.00×", "200,000", "100,000", "8.00 GiB", "16.00 GiB"):
        assert number in note


def test_waterfall_colours_by_verdict_and_hatches_failures():
    fig = report.waterfall_figure(example())
    bars = {p.get_gid(): p for p in fig.axes[0].patches if p.get_gid()}
    assert set(bars) == {"eager", "compile", "bf16", "batch", "ckpt"}  # skipped fp8: no bar
    hexes = {name: "#" + "".join(f"{round(255 * c):02x}" for c in bar.get_facecolor()[:3])
             for name, bar in bars.items()}
    assert hexes["eager"] == COLOURS["baseline"]
    assert hexes["compile"] == hexes["batch"] == COLOURS["win"]
    assert hexes["bf16"] == COLOURS["noise"]
    assert hexes["ckpt"] == COLOURS["loss"] and bars["ckpt"].get_hatch() == "///"
    # Each bar spans from the level it built on to its own cumulative speed-up.
    assert bars["batch"].get_y() == pytest.approx(1.29)
    assert bars["batch"].get_y() + bars["batch"].get_height() == pytest.approx(2.0)
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert "2.00×\n8.00 GiB" in labels and "skipped" in labels


def holds(whole, part) -> bool:
    """Every key of `part`, recursively, is in `whole` with the same value (whole may add defaults)."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and holds(whole[k], v) for k, v in part.items())
    if isinstance(part, list):
        return isinstance(whole, list) and len(whole) == len(part) and all(map(holds, whole, part))
    return whole == part


def test_records_round_trip_without_losing_fields():
    data = json.loads(EXAMPLE.read_text())
    assert holds(to_dict(from_dict(Results, data)), data)  # every field back
    data["rungs"][0]["a_field_from_the_future"] = {"x": 1}
    data["another"] = [1, 2]
    again = to_dict(from_dict(Results, data))
    assert again["rungs"][0]["a_field_from_the_future"] == {"x": 1} and again["another"] == [1, 2]  # kept in extra
    assert holds(again, data)
    assert not holds(again, {**data, "status": "other"})  # the comparison can fail


def test_a_results_file_of_schema_1_still_loads_and_reports(tmp_path, capsys):
    data = json.loads(SCHEMA_1.read_text())
    assert data["schema"] == "speedladder.results/1"
    saved = results.load(SCHEMA_1)
    assert isinstance(saved.rungs[0], RungResult) and isinstance(saved.rungs[0].tokens_per_s, Spread)
    assert saved.rungs[1].gate.passed == data["rungs"][1]["gate"]["passed"]
    assert saved.rungs[0].tokens_per_s.median == data["rungs"][0]["tokens_per_s"]["median"]
    assert saved.profile.regime == data["profile"]["regime"]
    rows = report.rows(saved)
    assert next(r["tokens/s"] for r in rows) == f"{data['rungs'][0]['tokens_per_s']['median']:,.0f}"
    # Written again, it carries today's schema and every field it had.
    results.save(saved, tmp_path)
    rewritten = json.loads((tmp_path / results.FILENAME).read_text())
    assert rewritten["schema"] == data["schema"]  # a loaded file keeps the version it was written with
    assert {k for k in data} <= set(rewritten)


@pytest.fixture
def synthetic_windows(monkeypatch):
    """Timed windows of a stated length (no wall clock): 10 ms a step for every rung, times `slow` for a base
    re-timed beside a rung. The steps still run, so the gates see real training."""
    from speedladder import measure

    state = {"slow": 1.0}

    def window(step, device, tokens_per_step, steps, counter=measure.compile_count, edge=None, seconds=0.01,
               meter=None):
        for _ in range(steps):
            step()
        return measure.Window(steps * seconds, steps, steps * tokens_per_step, 0)

    def interleave(step, base, timing, base_timing, device, tps, base_tps, steps, windows, counter=None,
                   on_progress=None, meter=None):
        for i in range(windows):
            timing.windows.append(window(step, device, tps, steps, seconds=0.01 * (1 - 0.001 * i)))
            base_timing.windows.append(window(base, device, base_tps, steps, seconds=0.01 * state["slow"]))

    monkeypatch.setattr(measure, "time_window", window)
    monkeypatch.setattr(measure, "interleave", interleave)
    return state


@pytest.mark.parametrize("slow", [1.25, 1.0])
def test_a_base_that_drifts_only_when_re_timed_is_flagged_everywhere_and_only_then(slow, synthetic_windows,
                                                                                    tmp_path, capsys):
    synthetic_windows["slow"] = slow  # 1.25x the time: the base's tokens/s 20% below its own as a rung
    assert main(["run", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,bf16", "--steps", "2",
                 "--loss-steps", "2", "--learns-steps", "0", "--no-profile", "--no-process-peak", "--quiet",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (folder,) = tmp_path.iterdir()
    bf16 = next(r for r in json.loads((folder / "results.json").read_text())["rungs"] if r["name"] == "bf16")
    page = (folder / "report.html").read_text()
    row = next(line for line in out.splitlines() if line.startswith("│ bf16"))
    if slow == 1.0:
        assert bf16["base_drift"] is None and "†" not in out and "† drift" not in page, [
            line for line in out.splitlines() if "†" in line]
        return
    assert bf16["base_drift"] == pytest.approx(-0.2)
    assert "1.25× †" in row  # x prev against the slowed base, marked
    assert "bf16: † drift — eager ran at 10,240 tokens/s re-timed beside it, 20% below its own 12,800 as a rung" in out
    assert "× prev and × cum are ratios measured side by side and hold" in out
    assert "† drift — eager ran at 10,240 tokens/s" in page and "1.25× †" in page
    texts = [t.get_text() for t in report.waterfall_figure(results.load(folder)).axes[0].texts]
    assert any("drift -20%" in t for t in texts)
    assert main(["compare", str(folder), str(folder)]) == 0
    assert "warning: A drifted beyond 10%: bf16's base ran -20% beside it" in capsys.readouterr().out
    assert main(["check", "--baseline", str(folder), "--against", str(folder), "--drift-limit", "0.3"]) == 0
    assert "warning" not in capsys.readouterr().out  # within the stated limit: no warning
    assert main(["check", "--baseline", str(folder), "--against", str(folder)]) == 0  # a warning, not a failure
    assert "check: warning: the new run drifted beyond 10%: bf16's base ran -20% beside it" in capsys.readouterr().out
