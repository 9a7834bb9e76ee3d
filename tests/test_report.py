"""Part 8: the table, notes and waterfall read nothing but a results dict."""

from __future__ import annotations

import pytest

from speedladder import report

COLOURS = report.COLOURS


def rung(name, median, spread=0.02, verdict="win", built_on=None, role="rung", status="ok", passed=True, **kw):
    r = {"name": name, "rung": kw.pop("rung", name), "role": role, "status": status, "detail": kw.pop("detail", ""),
         "built_on": built_on, "precision": kw.pop("precision", "fp32"), "kind": "speed",
         "spec": {"batch_size": kw.pop("batch_size", 64)}, "warnings": []}
    if status == "ok":
        r.update(tokens_per_s={"median": median, "min": median * (1 - spread), "max": median * (1 + spread)},
                 step_ms=10.0, peak_memory_bytes=kw.pop("mem", 2**30), mfu=0.5, tflops=100.0, compile_s=None,
                 timing={"cache_hits": 0}, gate={"passed": passed, "detail": "" if passed else "logits differ"},
                 verdict=verdict, speedup_prev=kw.pop("prev", None), speedup_cum=kw.pop("cum", 1.0))
    return r


def results(rungs, fastest=None):
    return {"rungs": rungs, "fastest": fastest, "status": "complete", "learns_check": None,
            "config": {"preset": "d2l-512", "batch_size": 64, "seq_len": 128, "preset_note": None},
            "environment": {"device_name": "NVIDIA H200", "device_type": "cuda", "torch": "2.11.0"},
            "corpus": {"source": "timemachine"}}


def example():
    return results([
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


def test_notes_explain_skips_failures_and_the_control():
    text = "\n".join(report.notes(example()))
    assert "fp8: skipped — needs CUDA compute capability >= 8.9; this GPU is 8.0" in text
    assert "ckpt: gate failed — logits differ" in text
    assert "fp32 at B=512 ran out of memory: bf16 bought the headroom" in text
    assert "fastest rung that passed every gate: batch, 2.00× eager (200,000 tokens/s)" in text


def test_control_note_compares_speed_and_memory():
    res = example()
    res["rungs"][4] = rung("batch-fp32", 100_000, role="control", rung="batch", built_on="batch",
                           mem=16 * 2**30, verdict="control")
    text = "\n".join(report.notes(res))
    assert "at B=512, bf16 runs 2.00× the fp32 control's tokens/s (200,000 vs 100,000)" in text
    assert "peak memory 8.00 GiB vs 16.00 GiB (2.00× more in fp32)" in text


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
