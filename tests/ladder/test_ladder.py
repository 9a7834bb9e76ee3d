"""Parts 5-10 together: the ladder end to end, its records, and what it does when things go wrong."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from conftest import interrupt_at_window, plant

from speedladder import report
from speedladder.cli import main
from speedladder.ladder.builds_on import SHORT_BELOW
from speedladder.measure import judging, timer
from speedladder.models import definition
from speedladder.records import storage, to_dict
from speedladder.rungs import RUNGS, Requirement, Rung, RungError
from speedladder.spec import StepSpec
from speedladder.step.train_step import TrainStep
from speedladder.verify import gate_rule

FAST = ["--preset", "tiny", "--device", "cpu", "--window-steps", "3", "--loss-steps", "8", "--learns-steps", "60",
        "--no-profile", "--no-process-peak"]


def run_dir(out: Path) -> Path:
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return folder


def saved(out: Path) -> dict:
    return json.loads((run_dir(out) / "results.json").read_text())


def by_name(res: dict) -> dict[str, dict]:
    return {r["name"]: r for r in res["rungs"]}


@pytest.fixture(scope="module")
def source_run(tmp_path_factory) -> dict:
    """The default ladder R0-R4 on the tiny preset, profiled first: one run that the tests below read (a miss is
    not profiled again here: each costs a child process that compiles cold; tests/profile/test_explain.py covers that)."""
    out = tmp_path_factory.mktemp("source")
    import contextlib
    import io
    import threading


    # Which progress tickers were alive as each timed window began: none may be (a thread beside the steps).
    real, tickers = timer.time_window, []

    def watched(*args, **kwargs):
        tickers.append([t.name for t in threading.enumerate() if t.name == "speedladder-progress"])
        return real(*args, **kwargs)

    stdout, stderr = io.StringIO(), io.StringIO()
    timer.time_window = watched
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            rc = main(["run", *[a for a in FAST if a != "--no-profile"], "--explain-miss", "0", "--out", str(out)])
    finally:
        timer.time_window = real
    folder = run_dir(out)
    return {"rc": rc, "res": saved(out), "typed": storage.load(folder), "folder": folder,
            "out": stdout.getvalue(), "err": stderr.getvalue(), "tickers": tickers}


@pytest.mark.slow
def test_source_ladder_runs_every_rung(source_run):
    res = source_run["res"]
    assert source_run["rc"] == 0 and res["status"] == "complete"
    assert res["schema"] == storage.SCHEMA
    rungs = by_name(res)
    # The batch rung's fp32 control runs only where the batch rung changed the precision (bf16 built upon).
    control = ["batch-fp32"] if rungs["batch"]["spec"]["autocast"] else []
    assert [r["name"] for r in res["rungs"]] == ["eager", "compile", "bf16", "batch", *control, "ckpt"]
    for r in res["rungs"]:
        assert r["status"] == "ok", r["detail"]
        short = r["verdict"] == "short"  # predicted and measured below 0.5x: one window, no gate (rule 4)
        assert len(r["timing"]["windows"]) == (1 if short else 5)
        assert all(w["seconds"] > 0 for w in r["timing"]["windows"])
        assert r["tokens_per_s"]["min"] <= r["tokens_per_s"]["median"] <= r["tokens_per_s"]["max"]
        assert r["peak_memory_bytes"] is None  # a CPU: n/a, not invented
        # No datasheet for a CPU: MFU against its own matmul ceiling at the rung's precision, measured here.
        assert r["peak_basis"].startswith("measured peak, a 512×512×512 matmul") and r["peak_tflops"] > 0
        assert r["mfu"] == pytest.approx(r["tflops"] / r["peak_tflops"])
        assert short or r["gate"]["passed"], r["gate"]["detail"]
        assert r["flops_per_token"] == definition.flops_per_token(res["model"]["matmul_params"], 2, 2, 16, 32)
    # Measured once per precision: every rung at a precision is taken against the same ceiling.
    by_precision: dict[str, set[float]] = {}
    for r in res["rungs"]:
        by_precision.setdefault(r["precision"], set()).add(r["peak_tflops"])
    assert set(by_precision) == {"fp32", "bf16"} and all(len(p) == 1 for p in by_precision.values())


@pytest.mark.slow
def test_each_rung_builds_on_the_last_and_compile_is_timed_apart(source_run):
    rungs = by_name(source_run["res"])
    # R0 is the reference; compiled rungs report compile time apart, eager has none.
    assert rungs["eager"]["gate"]["reference"] and rungs["eager"]["verdict"] == "baseline"
    assert rungs["eager"]["compile_s"] is None
    # (A rung built on eager because compile did not pay runs uncompiled, and has none either.)
    assert rungs["compile"]["compile_s"] is not None
    assert all((rungs[n]["compile_s"] is not None) == rungs[n]["spec"]["compile"] for n in ("bf16", "batch", "ckpt"))
    assert rungs["compile"]["gate"]["equivalence"]["precision"] == "fp32"
    bf16 = rungs["bf16"]
    if bf16["verdict"] == "short":
        # Where bf16 is emulated (an AVX2 processor: about 0.1x), it is predicted and measured below SHORT_BELOW:
        # the ladder stops it after one window, ungated, and builds nothing on it (docs/measurement.md, rule 4).
        assert bf16["predicted"]["speedup"] < SHORT_BELOW and bf16["speedup_prev"] < SHORT_BELOW
        assert bf16["gate"] is None and len(bf16["timing"]["windows"]) == 1 and bf16["not_built_upon"]
    else:
        assert bf16["gate"]["equivalence"]["precision"] == "bf16"
    # Each builds on the best configuration below it: the last that passed and whose best estimate was above its
    # base (a speed rung that lost, or was noise at or below 1.0x, is measured and left out; on a busy machine the
    # tiny preset's bf16 can lose).
    expected, last = [], "eager"
    for n in ("compile", "bf16", "batch", "ckpt"):
        expected.append(last)
        r = rungs[n]
        above = r["verdict"] == "win" or (r["verdict"] in ("noise", "inconclusive") and r["speedup_prev"] > 1)
        passed = r["gate"] is not None and r["gate"]["passed"]  # a rung stopped short has no gate
        if passed and (r["kind"] != "speed" or above):
            last = n
        assert bool(r["not_built_upon"]) == ((passed or r["verdict"] == "short") and last != n)
    assert [rungs[n]["built_on"] for n in ("compile", "bf16", "batch", "ckpt")] == expected
    bf16_kept = expected[2] == "bf16"
    assert rungs["batch"]["spec"]["batch_size"] == 8
    assert rungs["batch"]["spec"]["autocast"] == ("bf16" if bf16_kept else None)
    if bf16_kept:  # else the batch rung is fp32 already, and no control is timed
        assert rungs["batch-fp32"]["spec"] == {**rungs["batch"]["spec"], "autocast": None, "tf32": False}
    assert ("batch-fp32" in rungs) == bf16_kept
    assert rungs["ckpt"]["spec"]["transforms"] == ["activation-checkpointing"]


@pytest.mark.slow
def test_speedups_and_verdicts_are_derived_from_the_windows(source_run):
    res = source_run["res"]
    rungs = by_name(res)
    for r in res["rungs"][1:]:
        base = rungs[r["built_on"]]
        # Against the base re-timed beside it, its windows interleaved with the rung's (rule 8); one a side for a
        # rung stopped short (rule 4).
        assert len(r["base_timing"]["windows"]) == len(r["timing"]["windows"]) == (1 if r["verdict"] == "short" else 5)
        beside = r["base_tokens_per_s"]
        assert r["speedup_prev"] == pytest.approx(r["tokens_per_s"]["median"] / beside["median"])
        assert r["speedup_cum"] == pytest.approx(base["speedup_cum"] * r["speedup_prev"])  # chained
        if r["role"] == "rung" and r["verdict"] != "short":
            assert r["verdict"] == judging.verdict(judging.Spread(**r["tokens_per_s"]), judging.Spread(**beside))


@pytest.mark.slow
def test_the_fastest_passing_rung_learns(source_run):
    res = source_run["res"]
    # Fastest by × cum: ratios measured side by side, not the tokens/s of rows timed at different times.
    fastest = max((r for r in res["rungs"] if r["role"] == "rung" and r["gate"] and r["gate"]["passed"]),
                  key=lambda r: r["speedup_cum"])
    assert res["fastest"] == fastest["name"] == res["learns_check"]["rung"]
    assert res["learns_check"]["passed"] and res["learns_check"]["steps"] == 60


@pytest.mark.slow
def test_the_config_environment_table_and_waterfall_are_saved(source_run):
    res, out = source_run["res"], source_run["out"]
    assert res["config"]["preset"] == "tiny" and res["config"]["batch_size"] == 4 and res["config"]["lr"] == 1e-3
    assert res["environment"]["torch"] == torch.__version__ and "git_commit" in res["environment"]
    for row in report.rows(source_run["typed"]):  # the printed table is the saved one
        assert row["tokens/s"] in out and row["× cum"] in out
    assert (source_run["folder"] / "waterfall.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_the_profile_predicts_every_rung_and_the_error_is_measured(source_run):
    res, out = source_run["res"], source_run["out"]
    rungs = by_name(res)
    prof = res["profile"]
    assert prof["regime"] in ("compute-bound", "memory-bound", "overhead-bound") and prof["evidence"]
    assert sum(c["share"] for c in prof["categories"].values()) == pytest.approx(1.0)
    assert [p["rung"] for p in res["predictions"]] == ["eager", "compile", "bf16", "batch", "ckpt"]
    assert json.loads((source_run["folder"] / "trace.json").read_text())["traceEvents"]
    for name in ("compile", "bf16", "batch", "ckpt"):
        r = rungs[name]
        assert r["predicted"]["speedup"] > 0 and r["predicted"]["reason"]
        assert r["prediction_error"] == pytest.approx(r["speedup_prev"] / r["predicted"]["speedup"] - 1)
    if "batch-fp32" in rungs:
        assert rungs["batch-fp32"]["predicted"] is None  # a control is compared with its rung, not predicted
    assert "predicted compile: " in out and "regime: " in " ".join(out.split())  # each prediction in the notes
    fig = report.waterfall_figure(source_run["typed"])
    marks = {ln.get_gid() for ln in fig.axes[0].lines if ln.get_gid()}
    assert {"predicted-compile", "predicted-bf16", "predicted-batch", "predicted-ckpt"} <= marks


@pytest.mark.slow
def test_progress_of_the_long_phases_goes_to_stderr(source_run):
    for phase in ("profile", "compiling", "window 5/5", "base window 5/5", "gates", "learns-check"):
        assert phase in source_run["err"]
    # The learns-check's two curves are told apart: the eager fp32 reference's lines, then the rung's own.
    lines = [ln for ln in source_run["err"].splitlines() if "learns-check" in ln and re.search(r" step \d+/", ln)]
    reference = [ln for ln in lines if "learns-check: eager fp32 reference, B=" in ln]
    checked = json.loads((source_run["folder"] / "results.json").read_text())["learns_check"]["rung"]
    own = [ln for ln in lines if f"learns-check {checked} step" in ln]
    # (Eager itself, when it is the fastest, is the reference's own step: its curve is not trained twice.)
    same = f"learns-check {checked} the same step as eager fp32 at this shape" in source_run["err"]
    assert reference and (own or same) and len(reference) + len(own) == len(lines)
    assert not own or lines.index(own[0]) > lines.index(reference[-1])
    # Long work says when it began and ended while it runs (in a log: plain lines; a ticker thread between them).
    err = source_run["err"]
    compiled = [r["name"] for r in source_run["res"]["rungs"] if r["spec"]["compile"]]
    assert "compile" in compiled
    for name in compiled:  # each that compiles: its first step and warm-up, shown
        assert f"{name} the first step (it compiles) and the warm-up: done in " in err
    assert "profile profiling in a child process: done in " in err
    assert f"learns-check {checked} 60 steps, and eager fp32's over the same batches (about " in err
    assert f"learns-check {checked} 60 steps, and eager fp32's over the same batches: done in " in err
    # ... and no ticker ran beside a timed window: each was stopped before the windows began.
    windows = sum(len(r["timing"]["windows"]) + len((r["base_timing"] or {}).get("windows", []))
                  for r in source_run["res"]["rungs"])
    assert len(source_run["tickers"]) == windows and not any(source_run["tickers"])


@pytest.fixture
def extra_rungs(monkeypatch):
    """Rungs that a test can climb: one that computes the wrong function faster, one that needs a GPU."""
    def drop_blocks(model):
        model.blocks = torch.nn.ModuleList()
        return model

    plant(monkeypatch, "drop-blocks", drop_blocks)
    monkeypatch.setitem(RUNGS, "wrong", Rung(
        "wrong", "a deliberately wrong rung: skips every block, so it is faster and computes something else",
        "speed", lambda s, e: dataclasses.replace(s, transforms=(*s.transforms, "drop-blocks"))))
    monkeypatch.setitem(RUNGS, "gpu-only", Rung(
        "gpu-only", "a rung that needs a CUDA device, to show how a skip is reported", "speed",
        lambda s, e: dataclasses.replace(s, compile=True), Requirement(devices=("cuda",))))


@pytest.mark.slow
@pytest.mark.isa
def test_a_wrong_rung_fails_its_gate_and_is_never_fastest(tmp_path, extra_rungs, capsys):
    rc = main(["run", *FAST, "--rungs", "eager,wrong,gpu-only,ckpt", "--out", str(tmp_path)])
    assert rc == 0
    res = saved(tmp_path)
    rungs = by_name(res)
    wrong = rungs["wrong"]
    assert wrong["status"] == "ok" and not wrong["gate"]["passed"]
    assert not wrong["gate"]["equivalence"]["passed"]
    # It skips every block, so it is faster on a quiet machine; whatever its speed here, it can never be chosen:
    assert res["fastest"] != "wrong"
    # The skipped rung says why; the next rung builds on the last one that passed.
    assert rungs["gpu-only"]["status"] == "skipped"
    assert rungs["gpu-only"]["detail"] == "needs cuda; this device is cpu"
    assert rungs["ckpt"]["built_on"] == "eager"
    assert rungs["ckpt"]["spec"]["transforms"] == ["activation-checkpointing"]
    out = capsys.readouterr().out
    assert "wrong: gate failed, not built upon — " in out
    assert "skipped" in out and "needs cuda; this device is cpu" in out
    row = next(line for line in out.splitlines() if line.startswith("wrong "))
    assert [c.strip() for c in row.split("│")][-3::2] == ["FAIL", "gate"]  # the gate, and why not built upon
    fig = report.waterfall_figure(storage.load(run_dir(tmp_path)))
    bars = {p.get_gid(): p for p in fig.axes[0].patches if p.get_gid()}
    assert bars["wrong"].get_hatch() == "///"  # failed: hatched
    assert bars["eager"].get_hatch() is None
    assert "gpu-only" not in bars  # skipped: no bar


@pytest.mark.slow
def test_results_are_saved_after_every_rung(tmp_path, monkeypatch):
    snapshots = []
    real_save = storage.save

    def spy(res, folder):
        snapshots.append(to_dict(res))
        return real_save(res, folder)

    monkeypatch.setattr(storage, "save", spy)
    assert main(["run", *FAST, "--rungs", "eager,bf16,ckpt", "--quiet", "--out", str(tmp_path)]) == 0
    finished = [[r["status"] for r in s["rungs"]] for s in snapshots]
    assert ["ok"] in finished and ["ok", "ok"] in finished and ["ok", "ok", "ok"] in finished
    assert snapshots[-1]["status"] == "complete"


def test_out_of_memory_in_one_rung_is_recorded_and_the_ladder_goes_on(tmp_path, monkeypatch):
    real_init = TrainStep.__init__

    def init(self, spec, *args, **kwargs):
        if spec.autocast == "bf16" and not spec.transforms:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        real_init(self, spec, *args, **kwargs)

    monkeypatch.setattr(TrainStep, "__init__", init)
    assert main(["run", *FAST, "--rungs", "eager,bf16,ckpt", "--quiet", "--out", str(tmp_path)]) == 0
    rungs = by_name(saved(tmp_path))
    assert rungs["bf16"]["status"] == "oom" and "out of memory" in rungs["bf16"]["detail"]
    assert rungs["ckpt"]["status"] == "ok" and rungs["ckpt"]["built_on"] == "eager"


def test_ctrl_c_keeps_the_results_so_far(tmp_path, monkeypatch, capsys):
    interrupt_at_window(monkeypatch, 7)  # eager's 5 windows, then the 2nd of bf16's (interleaved with eager's)
    rc = main(["run", *FAST, "--rungs", "eager,bf16,ckpt", "--quiet", "--out", str(tmp_path)])
    assert rc == 130
    res = saved(tmp_path)
    assert res["status"] == "interrupted"
    assert [r["status"] for r in res["rungs"]] == ["ok", "interrupted"]
    assert (run_dir(tmp_path) / "waterfall.png").exists()
    captured = capsys.readouterr()
    assert "interrupted" in captured.err and "eager" in captured.out


def test_a_cut_during_the_gates_keeps_the_rungs_speed(tmp_path, monkeypatch):
    """A rung is timed, and its speed saved, before its reference is built: a cap (SIGINT) that falls while the
    reference is made keeps the speed, and the gate says it was cut (the H200's batch and ckpt rungs were never
    measured while the reference came first)."""
    from speedladder.verify import reference

    on_disk = []

    def cut(*args, **kwargs):
        on_disk.append(saved(tmp_path))  # what results.json held when the reference began
        raise KeyboardInterrupt
    monkeypatch.setattr(reference, "build", cut)
    rc = main(["run", *FAST, "--rungs", "eager,bf16", "--quiet", "--out", str(tmp_path)])
    assert rc == 130
    (before,) = on_disk
    assert by_name(before)["eager"]["tokens_per_s"]["median"] > 0 and by_name(before)["eager"]["status"] == "ok"
    res = saved(tmp_path)
    eager = by_name(res)["eager"]
    assert res["status"] == "interrupted" and [r["name"] for r in res["rungs"]] == ["eager"]
    assert eager["status"] == "ok" and eager["tokens_per_s"] == by_name(before)["eager"]["tokens_per_s"]
    assert eager["gate"]["cut"] and not eager["gate"]["passed"]
    assert "stopped during its gates" in eager["gate"]["detail"]


def test_a_batch_that_outgrows_the_corpus_is_skipped(tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 8)  # 352 characters
    out = tmp_path / "runs"
    assert main(["run", *FAST, "--data", str(text), "--batch-size", "8", "--batch-multiplier", "4",
                 "--rungs", "eager,batch", "--quiet", "--out", str(out)]) == 0
    batch = by_name(saved(out))["batch"]
    assert batch["status"] == "skipped" and "exceeds the corpus" in batch["detail"]


def test_a_rung_whose_spec_cannot_be_made_is_an_error_saved_without_a_spec(tmp_path, monkeypatch, capsys):
    def refuse(spec, env):
        raise RungError("no spec today")

    monkeypatch.setitem(RUNGS, "no-spec", Rung("no-spec", "a spec transform that refuses", "speed", refuse))
    assert main(["run", *FAST, "--learns-steps", "0", "--rungs", "eager,no-spec", "--quiet", "--out", str(tmp_path)]) == 0
    rung = by_name(saved(tmp_path))["no-spec"]
    assert rung["status"] == "error" and rung["detail"] == "no spec today" and rung["spec"] is None
    typed = storage.load(run_dir(tmp_path))
    assert typed.rung("no-spec").spec is None and isinstance(typed.rung("eager").spec, StepSpec)
    assert "no spec today" in capsys.readouterr().out
    assert main(["gates", str(run_dir(tmp_path)), "no-spec", "--quiet"]) == 2
    assert "no-spec was not measured in this run (error)" in capsys.readouterr().err


@pytest.mark.slow
def test_a_gate_that_cannot_run_keeps_the_speed_but_never_passes(tmp_path, monkeypatch):
    real = gate_rule.verdict

    def verdict(step, ref, *args):
        if step.spec.autocast == "bf16":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
        return real(step, ref, *args)

    monkeypatch.setattr(gate_rule, "verdict", verdict)
    assert main(["run", *FAST, "--rungs", "eager,bf16", "--quiet", "--out", str(tmp_path)]) == 0
    res = saved(tmp_path)
    bf16 = by_name(res)["bf16"]
    assert bf16["status"] == "ok" and bf16["tokens_per_s"]["median"] > 0
    assert not bf16["gate"]["passed"]
    assert bf16["gate"]["detail"] == "the gates could not run: ran out of memory"
    assert res["fastest"] == "eager"


@pytest.mark.slow
def test_full_ladder_skips_cuda_rungs_with_reasons_and_measures_ckpt_beside_the_top(tmp_path, capsys, monkeypatch):
    # The compile rung is skipped here (as without a compiler) to keep the test free of compilation.
    monkeypatch.setitem(RUNGS, "compile", dataclasses.replace(RUNGS["compile"], requires=Requirement(devices=("cuda",))))
    rc = main(["run", *FAST, "--ladder", "full", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    res = saved(tmp_path)
    assert res["config"]["ladder"] == "full" and res["config"]["beside"] == ["ckpt"]
    rungs = by_name(res)
    control = ["batch-fp32"] if rungs["batch"]["spec"]["autocast"] else []  # only where bf16 was built upon
    assert [r["name"] for r in res["rungs"]] == ["eager", "compile", "bf16", "sdpa", "fused-adamw", "pad-vocab",
                                                 "batch", *control, "max-autotune", "fp8", "ckpt"]
    for name in ("max-autotune", "fp8"):
        assert rungs[name]["status"] == "skipped" and rungs[name]["detail"] == "needs cuda; this device is cpu"
        assert f"{name}: skipped — needs cuda; this device is cpu" in out
    for name in ("sdpa", "fused-adamw", "pad-vocab"):
        assert rungs[name]["status"] == "ok" and rungs[name]["gate"]["passed"], rungs[name]["gate"]["detail"]
    # Each composes on the rung it built on: the last below it that paid (for sdpa and fused-adamw, whether their
    # best estimate was above their base's is this run's measurement).
    pad, batch = rungs["pad-vocab"], rungs["batch"]
    assert pad["spec"]["transforms"] == [*rungs[pad["built_on"]]["spec"]["transforms"], "pad-vocab"]
    assert batch["spec"]["optimizer"] == rungs[batch["built_on"]]["spec"]["optimizer"]
    assert ("sdpa" in pad["spec"]["transforms"]) == (not rungs["sdpa"]["not_built_upon"])
    assert (batch["spec"]["optimizer"] == "adamw-fused") == (not rungs["fused-adamw"]["not_built_upon"])
    # ckpt is measured on the last spec that passed, beside it; nothing builds on it.
    top = [r for r in res["rungs"] if r["role"] == "rung" and r["status"] == "ok" and r["gate"]["passed"]][-1]
    ckpt = rungs["ckpt"]
    assert ckpt["role"] == "beside" and ckpt["built_on"] == top["name"]
    assert ckpt["spec"] == {**top["spec"], "transforms": [*top["spec"]["transforms"], "activation-checkpointing"]}
    assert ckpt["verdict"] == judging.verdict(judging.Spread(**ckpt["tokens_per_s"]),
                                              judging.Spread(**ckpt["base_tokens_per_s"]))
    assert f"┊ ckpt beside {top['name']}" in out and f"ckpt: measured beside {top['name']}" in out
    assert all(r["wall_s"] > 0 for r in res["rungs"] if r["status"] == "ok")
    bars = {p.get_gid() for p in report.waterfall_figure(storage.load(run_dir(tmp_path))).axes[0].patches
            if p.get_gid()}
    assert "ckpt" in bars and "max-autotune" not in bars


def test_muon_rung_is_judged_by_tokens_to_adamws_loss_not_by_the_loss_band(tmp_path, capsys):
    rc = main(["run", *FAST, "--rungs", "eager,muon", "--target-steps", "30", "--learns-steps", "0",
               "--out", str(tmp_path)])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0
    muon = by_name(saved(tmp_path))["muon"]
    gate = muon["gate"]
    assert muon["spec"]["optimizer"] == "muon" and muon["kind"] == "optimizer"
    assert gate["equivalence"]["passed"]  # fixed weights: the same forward and backward
    assert gate["loss_band"]["applies"] is False and "not applicable" in gate["loss_band"]["detail"]
    t = gate["tokens_to_target"]
    assert t["steps"] == 30 and t["adamw_tokens"] is not None
    assert gate["passed"] == t["passed"] == (t["tokens"] is not None and t["tokens"] <= t["adamw_tokens"])
    assert "muon: loss band not applicable" in out and "to reach AdamW's loss" in out


class Sleepy(torch.nn.Module):
    """A block that sleeps before it computes: the same function, several times slower per step."""

    def __init__(self, block: torch.nn.Module, seconds: float) -> None:
        super().__init__()
        self.block, self.seconds = block, seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        time.sleep(self.seconds)
        return self.block(x)


@pytest.fixture
def slow_rung(monkeypatch):
    """A speed rung with the same math that costs ~10x a tiny step (the tiny preset's step takes ~2 ms here)."""
    def sleepy(model):
        model.blocks[0] = Sleepy(model.blocks[0], 0.02)
        return model

    plant(monkeypatch, "sleepy", sleepy)
    monkeypatch.setitem(RUNGS, "slow", Rung(
        "slow", "a planted loss: the same function, sleeping 20 ms a step", "speed",
        lambda s, e: dataclasses.replace(s, transforms=(*s.transforms, "sleepy"))))


@pytest.mark.slow
@pytest.mark.isa
@pytest.mark.parametrize("stack_all", [False, True])
def test_a_loss_is_measured_and_drawn_red_and_the_next_rung_builds_on_the_best_so_far(tmp_path, slow_rung,
                                                                                       stack_all):
    args = ["run", *FAST, "--learns-steps", "0", "--rungs", "eager,slow,sdpa", "--quiet", "--out", str(tmp_path)]
    assert main(args + (["--stack-all"] if stack_all else [])) == 0
    res = saved(tmp_path)
    rungs = by_name(res)
    slow, sdpa = rungs["slow"], rungs["sdpa"]
    assert slow["gate"]["passed"], slow["gate"]["detail"]  # the same function: every gate passes
    assert slow["verdict"] == "loss" and slow["speedup_prev"] < 0.5  # ~10x slower, judged beside eager
    fig = report.waterfall_figure(storage.load(run_dir(tmp_path)))
    bars = {p.get_gid(): p for p in fig.axes[0].patches if p.get_gid()}
    assert bars["slow"].get_facecolor()[:3] == pytest.approx((0xd6 / 255, 0x27 / 255, 0x28 / 255))  # red
    if stack_all:  # the source text's pure cumulative ladder: every passing rung stacked, losses too
        assert sdpa["built_on"] == "slow" and sdpa["spec"]["transforms"] == ["sleepy", "sdpa"]
        assert not slow["not_built_upon"]
    else:
        assert sdpa["built_on"] == "eager" and sdpa["spec"]["transforms"] == ["sdpa"]
        assert slow["not_built_upon"].startswith("slower: a loss") and "build on eager" in slow["not_built_upon"]
        # × cum chains along what was built upon: sdpa's is its own ratio over eager, not slow's loss times it.
        assert sdpa["speedup_cum"] == pytest.approx(sdpa["speedup_prev"])
        ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
        assert "slow\n(not built upon:\nslower)" in ticks
        lines = report.text.notes(storage.load(run_dir(tmp_path)))
        assert any(line.startswith("slow: not built upon — slower: a loss") and "(red on the waterfall" in line
                   for line in lines)


@pytest.mark.parametrize("stack_all", [False, True])
def test_noise_is_built_upon_only_above_one(tmp_path, monkeypatch, stack_all):
    """What to build on follows the best estimate (docs/measurement.md, rule 13): two rungs with the same math whose
    windows overlap their base's (noise, no claim), planted at 0.95x and 1.05x. The first is not built upon
    (slower); the second is, and the rung above it builds on it. --stack-all builds on both."""
    from speedladder.ladder import climb as climbing
    from speedladder.measure import judging
    from speedladder.measure.timer import Window

    for name in ("down", "up"):
        plant(monkeypatch, name, lambda model: model)  # the same function
        monkeypatch.setitem(RUNGS, name, Rung(name, "planted: the same math, windows planted", "speed",
                                              lambda s, e, name=name: dataclasses.replace(
                                                  s, transforms=(*s.transforms, name))))
    base_rates = [100.0, 96.0, 104.0, 98.0, 102.0]
    planted = {"down": [95.0, 100.0, 90.0, 97.0, 93.0], "up": [105.0, 100.0, 110.0, 103.0, 107.0]}
    real = climbing.measure_spec

    def measure(work, spec, say, **kw):
        m, step = real(work, spec, say, **kw)
        mine = next((n for n in reversed(spec.transforms) if n in planted), None)
        if mine is not None and m.base_timing is not None:  # tokens per window: the rate x 1 s
            m.timing.windows = [measure_window(r) for r in planted[mine]]
            m.base_timing.windows = [measure_window(r) for r in base_rates]
            m.tokens_per_s, m.base_tokens_per_s = judging.tokens_per_s(m.timing), judging.tokens_per_s(m.base_timing)
        return m, step

    def measure_window(rate: float) -> Window:
        return Window(seconds=1.0, steps=1, tokens=int(rate), recompiles=0)

    monkeypatch.setattr(climbing, "measure_spec", measure)
    args = ["run", *FAST, "--learns-steps", "0", "--windows", "5", "--rungs", "eager,down,up,sdpa", "--quiet",
            "--out", str(tmp_path)]
    assert main(args + (["--stack-all"] if stack_all else [])) == 0
    rungs = by_name(saved(tmp_path))
    down, up, sdpa = rungs["down"], rungs["up"], rungs["sdpa"]
    assert down["verdict"] == up["verdict"] == "noise"  # the ranges overlap: no claim either way
    assert down["speedup_prev"] == pytest.approx(95 / 100) and up["speedup_prev"] == pytest.approx(105 / 100)
    assert up["built_on"] == ("down" if stack_all else "eager") and sdpa["built_on"] == "up"
    assert not up["not_built_upon"]
    if stack_all:
        assert not down["not_built_upon"] and up["spec"]["transforms"] == ["down", "up"]
    else:
        assert down["not_built_upon"].startswith("slower: noise, 0.95x eager re-timed beside it")
        assert up["spec"]["transforms"] == ["up"] and sdpa["spec"]["transforms"] == ["up", "sdpa"]
        lines = report.text.notes(storage.load(run_dir(tmp_path)))
        assert any(line.startswith("down: not built upon — slower: noise") and "(pale on the waterfall" in line
                   for line in lines)


def test_a_rung_predicted_far_below_its_base_is_timed_in_one_short_window_unless_it_surprises(tmp_path, slow_rung,
                                                                                               monkeypatch):
    def sleepier(model):  # 100 ms a step, not 20: far below eager's even where a busy machine slows it to 20 ms
        model.blocks[0] = Sleepy(model.blocks[0], 0.1)
        return model

    plant(monkeypatch, "sleepy", sleepier)
    """No minute spent on what is known (docs/measurement.md, rule 4): a rung predicted below 0.5x its base is timed
    in one window beside it and stops there, neither gated nor built upon, its verdict `short` (one window claims
    nothing). One predicted so that measures within 2x of its base is timed in full and gated."""
    from speedladder.ladder.climb import Ladder
    from speedladder.records import Prediction

    planted = {"slow": Prediction(0.1, "planted: it sleeps 20 ms a step"), "sdpa": Prediction(0.1, "planted, wrong")}
    monkeypatch.setattr(Ladder, "_predicted", lambda self, rung: planted.get(rung.name))
    assert main(["run", *FAST, "--learns-steps", "0", "--rungs", "eager,slow,sdpa", "--quiet",
                 "--out", str(tmp_path)]) == 0
    rungs = by_name(saved(tmp_path))
    slow, sdpa = rungs["slow"], rungs["sdpa"]
    assert slow["verdict"] == "short" and slow["timing"]["short"] and slow["speedup_prev"] < 0.5
    assert len(slow["timing"]["windows"]) == len(slow["base_timing"]["windows"]) == 1
    assert slow["gate"] is None and slow["saved_activation_bytes"] is None  # stopped there: no gate, no meter
    assert "one window can claim neither a win nor a loss" in slow["verdict_detail"]
    assert slow["not_built_upon"].startswith("slower:") and "in one short window" in slow["not_built_upon"]
    assert sdpa["built_on"] == "eager" and sdpa["spec"]["transforms"] == ["sdpa"]
    # The surprise: predicted at 0.1x, measured within 2x of its base: every window, every gate.
    assert not sdpa["timing"]["short"] and len(sdpa["timing"]["windows"]) == 5 and sdpa["gate"]["passed"]
    assert sdpa["verdict"] in ("win", "noise", "loss")
    typed = storage.load(run_dir(tmp_path))
    row = next(r for r in report.rows(typed) if r["rung"] == "slow")
    assert (row["verdict"], row["gate"], row["not built upon"]) == ("short", "—", "slower")
    assert "(" not in row["× prev"]  # one window a side has no range
    lines = report.text.notes(typed)
    assert any(line.startswith("slow: verdict short — one short window beside its base") for line in lines)
    assert typed.fastest != "slow"
    # --stack-all builds on every rung that passes its gates: each is timed and gated in full.
    assert main(["run", *FAST, "--learns-steps", "0", "--rungs", "eager,slow", "--stack-all", "--quiet",
                 "--out", str(tmp_path / "all")]) == 0
    slow = by_name(saved(tmp_path / "all"))["slow"]
    assert slow["verdict"] == "loss" and len(slow["timing"]["windows"]) == 5 and slow["gate"]["passed"]


def test_an_fp32_control_runs_only_where_the_precision_changed(tmp_path):
    """The batch rung on eager is fp32 already: its control would measure the same configuration again."""
    assert main(["run", *FAST, "--learns-steps", "0", "--rungs", "eager,batch", "--quiet", "--out", str(tmp_path)]) == 0
    assert [r["name"] for r in saved(tmp_path)["rungs"]] == ["eager", "batch"]
