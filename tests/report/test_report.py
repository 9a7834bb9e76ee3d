"""The table, notes and waterfall read nothing but saved results (typed records)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import resolved
from rich.console import Console

from speedladder import report
from speedladder.cli import main
from speedladder.measure.judging import Spread
from speedladder.records import (
    CorpusRecord,
    Environment,
    Gate,
    Results,
    RungResult,
    SavedModel,
    TimingRecord,
    from_dict,
    storage,
    to_dict,
)
from speedladder.spec import StepSpec

COLOURS = report.COLOURS
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "example-cpu-results.json"
# The saved example of 2026-11-29 (schema 1, before the codec), kept as it was written: old files must still load.
SCHEMA_1 = Path(__file__).resolve().parents[1] / "fixtures" / "results-schema1.json"


def rung(name, median, spread=0.02, verdict="win", built_on=None, role="rung", status="ok", passed=True, **kw):
    r = RungResult(name=name, rung=kw.pop("rung", name), role=role, reason="", kind="speed", built_on=built_on,
                   spec=StepSpec(kw.pop("batch_size", 64), 64), precision=kw.pop("precision", "fp32"),
                   requirement={}, status=status, detail=kw.pop("detail", ""))
    if status == "ok":
        r.tokens_per_s = Spread(median, median * (1 - spread), median * (1 + spread))
        r.step_ms, r.peak_memory_bytes, r.mfu, r.tflops = 10.0, kw.pop("mem", 2**30), 0.5, 100.0
        r.timing = TimingRecord()
        r.gate = Gate(passed=passed, detail="" if passed else "logits differ")
        r.verdict, r.speedup_prev, r.speedup_cum = verdict, kw.pop("prev", None), kw.pop("cum", 1.0)
    return r


def make(rungs, fastest=None) -> Results:
    return Results(schema=storage.SCHEMA, status="complete", created="2026-11-29T00:00:00+00:00", command=["x"],
                   config=resolved(preset="d2l-512", batch_size=64, seq_len=128),
                   environment=Environment(device_name="NVIDIA H200", device_type="cuda", torch="2.11.0"),
                   model=SavedModel(), corpus=CorpusRecord(source="timemachine"), rungs=rungs, fastest=fastest)


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
    assert rows["compile"]["× prev"] == "1.30×" and rows["compile"]["× cum"] == "1.30×"  # no base beside: no range
    # MFU against the device's one peak (the H200's dense bf16, 989.4 TFLOP/s), and against the row's own precision's.
    assert rows["compile"]["MFU"] == "10.1%" and rows["compile"]["MFU at its precision"] == "50.0%"
    assert rows["compile"]["peak mem"] == "1.00 GiB"
    assert rows["eager"]["× prev"] == "—" and rows["eager"]["compile s"] == "—"
    # The gate and the speed apart: ckpt failed a gate and was slower; neither word says the other.
    assert rows["ckpt"]["gate"] == "FAIL" and rows["ckpt"]["verdict"] == "loss"
    assert rows["└ batch fp32 control"]["verdict"] == "OOM"
    assert rows["fp8"]["verdict"] == "skipped" and rows["fp8"]["tokens/s"] == "—"
    # Why the rungs above do not build on a rung, in a word; nothing where they do (bf16's noise is built upon).
    assert {name: row["not built upon"] for name, row in rows.items()} == {
        "eager": "", "compile": "", "bf16": "", "batch": "", "└ batch fp32 control": "", "ckpt": "gate",
        "fp8": "skipped"}
    assert not any("failed (" in v or "✗" in v for row in rows.values() for v in row.values())


def words() -> Results:
    """Every reason a rung is not built upon: a passed loss, a failed gate (itself faster), a skip, an error; a
    memory rung beside the top; and the rungs that are built upon."""
    slower = rung("bf16", 90_000, built_on="eager", verdict="loss", prev=0.9, cum=0.9)
    slower.not_built_upon = "a loss, 0.90x eager re-timed beside it: the rungs above build on eager"
    return make([
        rung("eager", 100_000, verdict="baseline"),
        rung("compile", 120_000, built_on="eager", verdict="win", prev=1.2, cum=1.2, passed=False),
        slower,
        rung("sdpa", 110_000, built_on="eager", verdict="noise", prev=1.1, cum=1.1),
        rung("fp8", 0, status="skipped", detail="needs cuda"),
        rung("muon", 0, status="error", detail="boom", built_on="sdpa"),
        rung("ckpt", 80_000, role="beside", built_on="sdpa", verdict="loss", prev=0.73, cum=0.8),
    ], fastest="sdpa")


def test_a_rung_not_built_upon_says_why_in_one_word_in_the_table_the_notes_and_the_waterfall():
    res = words()
    rows = {r["rung"]: r for r in report.rows(res)}
    said = {name: (row["gate"], row["verdict"], row["not built upon"]) for name, row in rows.items()}
    assert said == {"eager": ("pass", "baseline", ""), "compile": ("FAIL", "win", "gate"),
                    "bf16": ("pass", "loss", "slower"), "sdpa": ("pass", "noise", ""),
                    "fp8": ("—", "skipped", "skipped"), "muon": ("—", "error", "error"),
                    "┊ ckpt beside sdpa": ("pass", "loss", "beside")}
    notes = report.notes(res)
    assert "compile: gate failed, not built upon — logits differ" in notes
    assert any(n.startswith("bf16: not built upon — a loss") for n in notes)
    ticks = [t.get_text() for t in report.waterfall_figure(res).axes[0].get_xticklabels()]
    assert ticks == ["eager", "compile\n(not built upon:\ngate)", "bf16\n(not built upon:\nslower)", "sdpa",
                     "fp8", "muon", "ckpt\n(beside)"]


def test_x_prev_carries_the_range_its_windows_allow_which_is_what_the_verdict_reads():
    from speedladder.measure.judging import verdict

    res = example()
    compile_ = res.rungs[1]
    compile_.base_tokens_per_s = Spread(100_000, 98_000, 102_000)
    assert report.rows(res)[1]["× prev"] == "1.30× (1.25–1.35)"  # 127,400 / 102,000 and 132,600 / 98,000
    assert report.rows(res, spread=False)[1]["× prev"] == "1.30×"
    bases = (Spread(100_000, 98_000, 102_000), Spread(128_000, 126_000, 131_000), Spread(140_000, 135_000, 145_000))
    for base in bases:  # the range above 1, across it, below it: win, noise, loss
        compile_.base_tokens_per_s = base
        lo, hi = report.text.prev_range(compile_)
        assert verdict(compile_.tokens_per_s, base) == ("win" if lo > 1 else "loss" if hi < 1 else "noise")
    assert [verdict(compile_.tokens_per_s, b) for b in bases] == ["win", "noise", "loss"]


def widest() -> Results:
    """A full ladder at GPU speeds with every word there is: the widest compact table a run makes."""
    rs = [
        rung("eager", 1_234_567, verdict="baseline"),
        rung("compile", 1_100_000, built_on="eager", verdict="loss", prev=0.89, cum=0.89, passed=False),
        rung("bf16", 2_000_000, built_on="eager", prev=1.62, cum=1.62),
        rung("sdpa", 2_050_000, built_on="bf16", verdict="inconclusive", prev=1.02, cum=1.66),
        rung("fused-adamw", 2_100_000, built_on="sdpa", verdict="noise", prev=1.02, cum=1.70),
        rung("pad-vocab", 1_900_000, built_on="fused-adamw", verdict="loss", prev=0.90, cum=1.53),
        rung("batch", 3_000_000, built_on="fused-adamw", prev=1.43, cum=2.43),
        rung("batch-fp32", 1_500_000, role="control", rung="batch", built_on="batch", verdict="control", prev=0.5,
             cum=1.2),
        rung("max-autotune", 0, status="skipped", detail="needs cuda"),
        rung("fp8", 0, status="interrupted", detail="stopped"),
        rung("ckpt", 2_500_000, role="beside", built_on="batch", verdict="loss", prev=0.83, cum=2.0),
    ]
    rs[5].not_built_upon = "a loss"
    for r in rs:
        if r.ok and r.speedup_prev:
            m = r.tokens_per_s.median / r.speedup_prev
            r.base_tokens_per_s = Spread(m, m * 0.97, m * 1.03)
    rs[5].base_drift = -0.12
    return make(rs, fastest="batch")


def terminal(width: int) -> Console:
    """A terminal of `width` columns, as rich sees one (no colours, so the text is what a test reads)."""
    return Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None, highlight=False)


def table_rows(text: str, res: Results) -> tuple[list[str], list[list[str]]]:
    """The printed rung table: its lines (header to last row) and each row's cells."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("━"))
    head = next(i for i in range(rule - 1, -1, -1) if "│" not in lines[i]) + 1  # the header's first line
    body = lines[rule + 1:rule + 1 + len(res.rungs)]
    return lines[head - 1:rule + 1 + len(res.rungs)], [[c.strip() for c in line.split("│")] for line in body]


@pytest.mark.parametrize("width", [80, 100, 120])
@pytest.mark.parametrize("which", ["example", "widest"])
def test_the_default_table_fits_the_terminal_and_never_shortens_the_gate_or_the_verdict(which, width):
    res = storage.load(EXAMPLE) if which == "example" else widest()
    out = terminal(width)
    report.print_report(res, out)
    text = out.file.getvalue()
    lines, cells = table_rows(text, res)
    assert max(len(line.rstrip()) for line in lines[1:]) <= width  # the title is one line the terminal wraps
    assert text.splitlines()[0] == report.text.title(res)
    for row, want in zip(cells, report.rows(res)):
        assert len(row) == len(report.text.COMPACT)
        got = dict(zip(report.text.COMPACT, row))
        assert (got["gate"], got["verdict"], got["not built upon"]) == (want["gate"], want["verdict"],
                                                                        want["not built upon"])
        assert got["tokens/s"] == want["tokens/s"] and got["× cum"] == want["× cum"]
        assert got["× prev"].split(" (")[0].removesuffix(" †") == want["× prev"].split(" (")[0].removesuffix(" †")
    ranges = any("(" in row[3] for row in cells)
    if width == 120 or (width == 100 and which == "example"):  # room for × prev's range
        assert ranges and cells[0][0] == "eager"
    if width == 80:  # the ranges go first, then the rung and `on` columns are shortened with "…"
        assert not ranges
    assert "columns: the compact table; --wide prints every column" in text
    assert "pred ×" not in lines[1] + lines[2] and "MFU" not in lines[1] + lines[2]


def test_wide_prints_every_column_in_a_terminal_and_is_ignored_in_a_file():
    res = storage.load(EXAMPLE)
    out = terminal(80)
    report.print_report(res, out, wide=True)
    lines, cells = table_rows(out.file.getvalue(), res)
    header = [c.strip() for c in lines[1].split("│")]
    assert header == list(report.rows(res)[0])  # every column, the one-line header of report.html's table
    assert [dict(zip(header, row)) for row in cells] == report.rows(res)  # nothing squeezed or shortened
    assert max(len(line) for line in lines) > 150  # wider than the terminal: the terminal wraps, no column lost
    piped, wide_piped = Console(file=io.StringIO(), width=240), Console(file=io.StringIO(), width=240)
    report.print_report(res, piped)
    report.print_report(res, wide_piped, wide=True)
    assert wide_piped.file.getvalue() == piped.file.getvalue()  # to a file: the compact table either way
    assert max(len(line.rstrip()) for line in table_rows(piped.file.getvalue(), res)[0][1:]) <= 100


@pytest.mark.skipif(shutil.which("script") is None, reason="needs util-linux's script for a terminal")
@pytest.mark.parametrize("width", [80, 120])
def test_speedladder_report_in_a_real_terminal_keeps_the_gate_and_the_verdict(width, tmp_path):
    """`script -qc "stty cols N; speedladder report RUN_DIR"`: the command as a user runs it in a terminal."""
    shutil.copy(EXAMPLE, tmp_path / "results.json")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLE.parents[1] / "src"), env.get("PYTHONPATH")]))
    res = storage.load(EXAMPLE)
    for wide in (False, True):
        command = f"stty cols {width}; {sys.executable} -m speedladder report {tmp_path}" + (" --wide" * wide)
        proc = subprocess.run(["script", "-qec", command, "/dev/null"], capture_output=True, text=True, env=env,
                              timeout=120, check=False)
        assert proc.returncode == 0, proc.stdout[-2000:]
        text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", proc.stdout).replace("\r", "")
        lines, cells = table_rows(text, res)
        columns = list(report.rows(res)[0]) if wide else list(report.text.COMPACT)
        for row, want in zip(cells, report.rows(res)):
            got = dict(zip(columns, row))
            assert (got["gate"], got["verdict"]) == (want["gate"], want["verdict"])
        if not wide:
            assert max(len(line.rstrip()) for line in lines[1:]) <= width


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
    cudagraphs.timing = TimingRecord(window_steps=240, sized_from_step_s=0.0021, min_window_s=0.5)
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
    # Each bar says its own × prev and its × cum, nothing else: memory has a chart of its own (report.html).
    assert "1.55× prev\n2.00× cum" in labels and "1.00× cum" in labels and "skipped" in labels
    assert not any("GiB" in t or "drift" in t for t in labels)


def test_the_waterfall_keeps_its_legend_off_the_bars_marks_the_winner_and_leaves_the_race_its_rungs():
    """The legend outside the axes; a 1% gain still a visible bar; an optimizer rung drawn as an outline marked
    "judged by the race", never a red slab; the winner marked under its bar."""
    res = example()
    small = rung("sdpa", 202_000, built_on="batch", prev=1.01, cum=2.02, precision="bf16")
    muon = rung("muon", 60_000, built_on="sdpa", verdict="loss", prev=0.3, cum=0.6, precision="bf16")
    muon.kind, muon.not_built_upon = "optimizer", "race: an optimizer rung"
    res.rungs[5:] = [small, muon]
    res.fastest = "sdpa"
    fig = report.waterfall_figure(res)
    ax = fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    legend = ax.get_legend().get_window_extent(renderer)
    assert legend.x0 >= ax.get_window_extent(renderer).x1  # right of the axes: over no bar, no label
    bars = {p.get_gid(): p for p in ax.patches if p.get_gid()}
    top = ax.get_ylim()[1]
    assert bars["sdpa"].get_height() >= 0.01 * top  # a 1% gain is a bar, not a hairline
    assert bars["muon"].get_facecolor()[:3] == (1.0, 1.0, 1.0)  # an outline: not red
    assert bars["muon"].get_y() == pytest.approx(2.02)  # at the level it was measured on, not 0.3x below it
    labels = {t.get_gid(): t.get_text() for t in ax.texts if t.get_gid()}
    assert labels["label-muon"].startswith("judged by\nthe race") and "0.30× tokens/s" in labels["label-muon"]
    assert labels["winner"] == "★ winner"
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert "muon\n(not built upon:\nrace)" in ticks
    res.status = "interrupted"
    assert {t.get_gid(): t.get_text() for t in report.waterfall_figure(res).axes[0].texts}["winner"] == "★ best so far"


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
    saved = storage.load(SCHEMA_1)
    assert isinstance(saved.rungs[0], RungResult) and isinstance(saved.rungs[0].tokens_per_s, Spread)
    assert saved.rungs[1].gate.passed == data["rungs"][1]["gate"]["passed"]
    assert saved.rungs[0].tokens_per_s.median == data["rungs"][0]["tokens_per_s"]["median"]
    assert saved.profile.regime == data["profile"]["regime"]
    rows = report.rows(saved)
    assert next(r["tokens/s"] for r in rows) == f"{data['rungs'][0]['tokens_per_s']['median']:,.0f}"
    # Written again, it carries today's schema and every field it had.
    storage.save(saved, tmp_path)
    rewritten = json.loads((tmp_path / storage.FILENAME).read_text())
    assert rewritten["schema"] == data["schema"]  # a loaded file keeps the version it was written with
    assert {k for k in data} <= set(rewritten)


@pytest.fixture
def synthetic_windows(monkeypatch):
    """Timed windows of a stated length (no wall clock): 10 ms a step for every rung, times `slow` for a base
    re-timed beside a rung. The steps still run, so the gates see real training."""
    from speedladder.measure import counters, timer

    state = {"slow": 1.0}

    def window(step, device, tokens_per_step, steps, counter=counters.compile_count, edge=None, seconds=0.01,
               meter=None):
        for _ in range(steps):
            step()
        return timer.Window(steps * seconds, steps, steps * tokens_per_step, 0)

    def interleave(step, base, timing, base_timing, device, tps, base_tps, steps, windows, counter=None,
                   on_progress=None, meter=None, start=0):
        for i in range(start, start + windows):
            timing.windows.append(window(step, device, tps, steps, seconds=0.01 * (1 - 0.001 * i)))
            base_timing.windows.append(window(base, device, base_tps, steps, seconds=0.01 * state["slow"]))

    monkeypatch.setattr(timer, "time_window", window)
    monkeypatch.setattr(timer, "interleave", interleave)
    return state


@pytest.mark.parametrize("slow", [1.25, 1.02, 1.0])
def test_a_base_that_drifts_only_when_re_timed_is_flagged_everywhere_and_only_then(slow, synthetic_windows,
                                                                                    tmp_path, capsys):
    synthetic_windows["slow"] = slow  # 1.25x the time: the base's tokens/s 20% below its own as a rung
    assert main(["run", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,bf16", "--window-steps", "2",
                 "--loss-steps", "2", "--learns-steps", "0", "--no-profile", "--no-process-peak", "--quiet",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (folder,) = tmp_path.iterdir()
    bf16 = next(r for r in json.loads((folder / "results.json").read_text())["rungs"] if r["name"] == "bf16")
    page = (folder / "report.html").read_text()
    row = next(line for line in out.splitlines() if line.startswith("bf16 "))
    marked = re.compile(r"1\.25× \(\d\.\d\d–\d\.\d\d\) †")  # x prev against the slowed base, its range, marked
    if slow < 1.1:  # none, or a 2% drift: within the threshold, it says nothing but that
        assert (bf16["base_drift"] is None) == (slow == 1.0)
        assert "†" not in out and "† drift" not in page, [line for line in out.splitlines() if "†" in line]
        assert "drift: none beyond 10%" in out and "⚠ drift" not in out and "⚠ drift" not in page
        return
    assert bf16["base_drift"] == pytest.approx(-0.2)
    assert marked.search(row)
    assert "bf16: † drift — eager ran at 10,240 tokens/s re-timed beside it, 20% below its own 12,800 as a rung" in out
    assert "× prev and × cum are ratios measured side by side and hold" in out
    assert "† drift — eager ran at 10,240 tokens/s" in page and marked.search(page)
    trust = next(line for line in out.splitlines() if line.startswith("trust: "))
    assert "⚠ drift: eager, re-timed beside bf16, ran 20% below its own speed (beyond 10%)" in trust
    assert "⚠ drift: eager, re-timed beside bf16, ran 20% below" in page
    texts = [t.get_text() for t in report.waterfall_figure(storage.load(folder)).axes[0].texts]
    assert not any("drift" in t for t in texts)  # said once, in the trust line: not on the chart
    assert main(["compare", str(folder), str(folder)]) == 0
    assert "warning: A drifted beyond 10%: bf16's base ran -20% beside it" in capsys.readouterr().out
    assert main(["check", "--baseline", str(folder), "--against", str(folder), "--drift-limit", "0.3"]) == 0
    assert "warning" not in capsys.readouterr().out  # within the stated limit: no warning
    assert main(["check", "--baseline", str(folder), "--against", str(folder)]) == 0  # a warning, not a failure
    assert "check: warning: the new run drifted beyond 10%: bf16's base ran -20% beside it" in capsys.readouterr().out


def test_an_optimizer_rung_is_measured_but_not_built_upon_and_the_race_judges_it(synthetic_windows, tmp_path, capsys):
    """muon on the ladder: timed beside eager and gated (tokens to AdamW's loss), then left out of the climb with
    its reason (race), so sdpa builds on eager; the table says race, the waterfall draws it as an outline, and the
    conclusion hands it to the race with the command."""
    assert main(["run", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,muon,sdpa", "--window-steps", "2",
                 "--loss-steps", "2", "--learns-steps", "0", "--target-steps", "10", "--no-profile",
                 "--no-process-peak", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (folder,) = tmp_path.iterdir()
    saved = storage.load(folder)
    muon, sdpa = saved.rung("muon"), saved.rung("sdpa")
    assert muon is not None and sdpa is not None and muon.passed and muon.kind == "optimizer"
    assert muon.not_built_upon.startswith("race: an optimizer rung, judged by time to a target loss")
    assert sdpa.built_on == "eager" and sdpa.spec is not None and sdpa.spec.optimizer != "muon"
    rows = {r["rung"]: r for r in report.rows(saved)}
    assert rows["muon"]["not built upon"] == "race"
    assert "muon: not built upon — race: " in out and "(an outline on the waterfall;" in out
    assert "judged by the race: muon: " in out and "next: speedladder race --preset tiny --rungs eager,muon" in out
    bars = {p.get_gid(): p for p in report.waterfall_figure(saved).axes[0].patches if p.get_gid()}
    assert bars["muon"].get_facecolor()[:3] == (1.0, 1.0, 1.0)


H200 = Path(__file__).resolve().parents[1] / "fixtures" / "h200"


def test_mfu_is_taken_against_one_peak_per_device_named_in_its_header():
    """The H200's GPT-2 ladder of 2026-12-04: eager fp32 read 56.7% of fp32's 66.9 TFLOP/s, bf16 9.8% and sdpa 18.9%
    of bf16's 989: against one peak, the column rises with the speed. Each row's own precision's stays in the
    details. Where no datasheet has the device, the highest peak measured here; --peak-tflops's bf16 over both."""
    from speedladder.report.mfu import DevicePeak, device_peak

    res = storage.load(H200 / "gpt2.json")
    peak = device_peak(res)
    assert peak is not None and peak.tflops == pytest.approx(989.4) and peak.header == "MFU vs bf16 989 TF"
    rows = {r["rung"]: r for r in report.rows(res)}
    mfu = [float(rows[n]["MFU"].rstrip("%")) for n in ("eager", "bf16", "sdpa")]
    assert mfu == sorted(mfu) and mfu[0] == pytest.approx(100 * 56.7 / 100 * 66.9 / 989.4, abs=0.1)
    assert [rows[n]["MFU at its precision"] for n in ("eager", "bf16", "sdpa")] == ["56.7%", "9.8%", "18.9%"]
    wide = terminal(400)
    report.print_report(res, wide, wide=True)
    assert "MFU vs bf16 989 TF" in wide.file.getvalue() and "MFU at its precision" in wide.file.getvalue()
    cpu = example()
    cpu.environment = Environment(device_name="Intel(R) Xeon(R)", device_type="cpu")
    for r, (tflops, precision) in zip(cpu.rungs, [(0.026, "fp32"), (0.026, "fp32"), (0.051, "bf16")]):
        r.peak_tflops, r.precision, r.peak_basis = tflops, precision, "measured peak, a 512×512×512 matmul's"
    peak = device_peak(cpu)
    assert peak is not None and (peak.tflops, peak.precision) == (0.051, "bf16") and "measured here" in peak.basis
    cpu.config = resolved(peak_tflops={"bf16": 0.2})
    assert device_peak(cpu) == DevicePeak(0.2, "bf16", "bf16, given by --peak-tflops")


@pytest.mark.parametrize("name", ["small", "gpt2", "cuda", "second-d2l", "second-gpt2"])
def test_the_h200_tables_fit_100_columns_with_every_gate_and_verdict(name):
    """`speedladder report` of each H200 file in a terminal of 100 columns: no line of the table wider, every row's
    gate, verdict and why it is not built upon as the rows hold them."""
    res = storage.load(H200 / f"{name}.json")
    out = terminal(100)
    report.print_report(res, out)
    lines, cells = table_rows(out.file.getvalue(), res)
    assert max(len(line.rstrip()) for line in lines[1:]) <= 100
    for row, want in zip(cells, report.rows(res)):
        got = dict(zip(report.text.COMPACT, row))
        assert (got["gate"], got["verdict"], got["not built upon"]) == (want["gate"], want["verdict"],
                                                                        want["not built upon"])


def test_an_interrupted_waterfall_names_what_it_never_reached_and_its_best_so_far():
    fig = report.waterfall_figure(storage.load(H200 / "gpt2.json"))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["eager", "bf16", "sdpa", "batch", "fused-adamw", "pad-vocab"]
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("not reached") == 2 and "interrupted" in texts and "★ best so far" in texts
    assert "1.94× prev\n4.91× cum" in texts  # sdpa's own gain, and the chain's


@pytest.mark.parametrize("cores, most, steal, level, words", [
    (16, 0.34, None, "ok", "alone"),  # a third of one core of sixteen says nothing
    (16, 0.34, 2.0, "warn", "the hypervisor stole up to 2.00 cores"),  # steal said apart, at the same threshold
    (16, 0.34, 0.5, "ok", "alone"),
    (2, 0.30, None, "warn", "others used up to 0.30 of 2 cores in 1 of 10 windows"),  # on 2 cores it matters
])
def test_the_trust_lines_machine_item_holds_load_and_steal_to_a_share_of_the_cores(cores, most, steal, level, words):
    from speedladder.measure import machine_load
    from speedladder.records import MachineLoad
    from speedladder.report import trust

    m = MachineLoad(cores=cores, shared_cores=machine_load.shared_cores(cores), before=0.1, windows=10, most=most,
                    shared_windows=int(most >= machine_load.shared_cores(cores)), steal_most=steal)
    res = make([])
    res.machine = m
    item = trust._machine(res)
    assert item is not None and item.level == level and words in item.text, item
