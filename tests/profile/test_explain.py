"""Miss attribution on saved profiles: which part of the step moved against the prediction, and by how much."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import resolved

from speedladder.cli import main
from speedladder.profile.categories import CATEGORIES, IDLE
from speedladder.profile.explain import names_of, to_explain
from speedladder.profile.predict import baseline_parts
from speedladder.profile.side_by_side import compare, sums
from speedladder.records import (
    Environment,
    Prediction,
    ProfileSummary,
    Results,
    RungResult,
    SavedModel,
    SideMs,
    TimedSteps,
    from_dict,
)
from speedladder.report.explained import lines_of
from speedladder.spec import StepSpec


def profile(ms: dict[str, float], compiled: bool = False) -> dict:
    """A saved profile (ProfileSummary as in results.json) with these ms per category, no per-op floor."""
    total = sum(ms.values())
    cats = {c: {"ms": ms.get(c, 0.0), "share": ms.get(c, 0.0) / total, "floor_ms": 0.0} for c in CATEGORIES}
    return {"categories": cats, "matmuls": {"attention_fraction": {"fp32": 0.0}}, "ops_ms": {},
            "spec": {"batch_size": 16, "seq_len": 64, "compile": compiled}, "device_type": "cpu",
            "tokens_per_step": 1024}


BASE = {"matmul": 10.0, "elementwise & norm": 3.0, "reductions & softmax": 1.0, "optimizer": 2.0, "copies & H2D": 1.0,
        IDLE: 3.0}


def test_a_slower_compiled_tail_is_named_with_what_the_model_expected():
    base = profile(BASE)
    rung = profile({**BASE, "elementwise & norm": 6.3, IDLE: 2.0}, compiled=True)  # tail +3.3 ms, overhead -1 ms
    before = baseline_parts(from_dict(ProfileSummary, base))
    after = {**before, "tail": before["tail"] / 3, "overhead": before["overhead"] / 3}  # the model: fused, 1/3 kept
    e = compare(base, rung, before, after, error=-0.3)  # measured slower than predicted
    assert e.culprit == "tail"
    tail = e.parts["tail"]
    assert round(tail.rung_ms - tail.base_ms, 6) == 3.3
    assert round(tail.expected_ms - tail.base_ms, 6) == round(-4.0 * 2 / 3, 6)  # 4 ms of tail, 2/3 fused away
    assert "+3.30 ms" in e.note and "-2.67 ms" in e.note and "C++ loops" in e.note
    assert e.categories["elementwise & norm"] == SideMs(base_ms=3.0, rung_ms=6.3)
    assert e.base_step_ms == 20.0 and round(e.rung_step_ms, 6) == 22.3


def test_a_rung_faster_than_predicted_names_the_part_that_saved_most_beyond_it():
    base = profile(BASE)
    rung = profile({**BASE, "matmul": 12.0, "optimizer": 0.5})  # matmuls cost more, optimizer far less
    before = baseline_parts(from_dict(ProfileSummary, base))
    after = {k: v * 4 / 3 for k, v in before.items()}  # a checkpoint-like prediction: everything 1/3 dearer
    e = compare(base, rung, before, after, error=+0.6)
    assert e.culprit == "optimizer"  # -1.5 ms where +0.67 ms was expected: the largest saving against it
    opt = e.parts["optimizer"]
    assert round(opt.rung_ms - opt.base_ms, 6) == -1.5 and round(opt.expected_ms - opt.base_ms, 6) == round(
        2.0 / 3, 6)


def test_predicted_parts_are_rescaled_to_the_base_profile():
    base = profile({k: 2 * v for k, v in BASE.items()})  # the base measured twice as slow as the model's parts
    before = baseline_parts(from_dict(ProfileSummary, profile(BASE)))
    after = {**before, "matmul": before["matmul"] / 2}
    e = compare(base, profile({k: 2 * v for k, v in BASE.items()}), before, after, error=-0.5)
    assert round(e.parts["matmul"].expected_ms - e.parts["matmul"].base_ms, 6) == -10.0  # -5 ms x 2


def _rung(name: str, built_on: str | None, error: float | None, role: str = "rung", prev: float | None = None,
          kind: str = "speed", verdict: str | None = None) -> RungResult:
    return RungResult(name=name, rung=name, role=role, reason="", kind=kind, built_on=built_on,
                      spec=StepSpec(16, 64), precision="fp32", requirement={}, status="ok", prediction_error=error,
                      speedup_prev=prev, verdict=verdict)


def test_every_loss_and_every_miss_is_explained_but_not_a_rung_stopped_short():
    """Not only the largest miss: each rung that lost (× prev below 1.0, a speed rung), missed or not, and each miss
    beyond the limit, in ladder order; a rung stopped short lost as its prediction said, and is explained by it."""
    res = Results(schema="", status="", created="", command=[], config=resolved(), environment=Environment(), model=SavedModel(),
                  rungs=[_rung("eager", None, None, verdict="baseline"),
                         _rung("compile", "eager", -0.23, prev=0.87, verdict="loss"),  # inside the limit, but lost
                         _rung("bf16", "eager", -0.30, prev=0.07, verdict="short"),
                         _rung("sdpa", "eager", 0.02, prev=0.98, verdict="noise"),  # a loss by its best estimate
                         _rung("batch", "eager", -0.1, prev=1.3, verdict="win"),
                         _rung("fused-adamw", "batch", 0.4, prev=1.4, verdict="win"),  # faster than predicted
                         _rung("ckpt", "fused-adamw", -0.05, prev=0.75, kind="memory", verdict="loss")])
    assert [r.name for r in to_explain(res, 0.25)] == ["compile", "sdpa", "fused-adamw"]


def _category_ms(matmul: float, tail: float, optimizer: float, overhead: float) -> dict[str, float]:
    return {"matmul": matmul, "elementwise & norm": tail, "optimizer": optimizer, IDLE: overhead}


def test_like_with_like_a_slow_bf16_step_is_not_blamed_on_the_profilers_tax():
    """The AVX2 processor's bf16: profiled 86.4 -> 773.0 ms a step (0.11x, as predicted: 0.10x), timed 51 -> 730 ms
    (0.07x). Set against the profiled base, the slower rung looked like a host overhead that grew a little; each
    profile set against its own timed step, the matmuls carry the miss, and the note says the profile does not add
    up to the timed ratio."""
    base = profile(_category_ms(30.0, 20.0, 10.0, 26.4))  # 86.4 ms profiled; 51 ms timed
    rung = profile(_category_ms(706.6, 20.0, 10.0, 36.4))  # 773.0 ms profiled; 730 ms timed
    before = baseline_parts(from_dict(ProfileSummary, base))
    after = {**before, "matmul": before["matmul"] * 26.92}  # the model: bf16 matmuls at 1/27 of fp32's speed
    predicted = sum(before.values()) / sum(after.values())
    assert predicted == pytest.approx(0.10, abs=0.005)
    measured = 51.0 / 730.0
    profiled_only = compare(base, rung, before, after, error=measured / predicted - 1)
    assert profiled_only.culprit == "overhead"  # what comparing unlike things said
    e = compare(base, rung, before, after, error=measured / predicted - 1,
                timed=TimedSteps(base_ms=51.0, rung_ms=730.0, x=measured))
    assert e.culprit == "matmul" and e.grew == "matmul" and e.basis == "timed"
    # Like with like: each side's parts add up to its own timed step.
    assert sum(v.base_ms for v in e.parts.values()) == pytest.approx(51.0)
    assert sum(v.rung_ms for v in e.parts.values()) == pytest.approx(730.0)
    assert e.profiled_x == pytest.approx(86.4 / 773.0) and e.adds_up is False
    line = sums(e)
    assert "86.4 → 773.0 ms a step under the profiler (0.11×), timed 51.0 → 730.0 ms (0.07×)" in line
    assert "does not add up to the timed ratio" in line and "+69%" in line and "+6%" in line


def compiled_profile(ms: dict[str, float], ops: int) -> dict:
    p = profile(ms, compiled=True)
    p.update(ops_per_step=ops, trace="trace-compile.json",
             compiler={"graphs": 3, "recompiles": 1, "graph_breaks": 1,
                       "break_reasons": {"Tensor.item() call": 1}, "kernel_calls": {"fused": 31, "library": 39}})
    return p


def test_compiles_loss_on_a_cpu_adds_up_and_says_what_the_compiler_did():
    """A CPU's compile, planted from the example run's profiles (docs/example-cpu-results.json): eager 40.1 ms and
    compile 52.2 ms profiled, 31.4 and 40.3 ms timed (0.78x where 1.17x was predicted). The explanation adds up to the
    measured ratio within 25%, names the category that grew, and says what the compiler did."""
    eager = {"matmul": 19.2, "elementwise & norm": 7.0, "reductions & softmax": 1.6, "optimizer": 3.9,
             "copies & H2D": 2.0, IDLE: 6.4}
    compiled = {"matmul": 22.3, "elementwise & norm": 22.7, "optimizer": 5.1, "copies & H2D": 0.1, IDLE: 2.0}
    base = {**profile(eager), "ops_per_step": 1328, "trace": "trace-eager.json"}
    rung = compiled_profile(compiled, 352)
    before = baseline_parts(from_dict(ProfileSummary, base))
    after = {**before, "tail": before["tail"] * 0.9, "overhead": before["overhead"] / 3}
    measured = 31.4 / 40.3
    e = compare(base, rung, before, after, error=measured / 1.17 - 1,
                timed=TimedSteps(base_ms=31.4, rung_ms=40.3, x=measured))
    assert e.adds_up and e.profiled_x is not None and abs(e.profiled_x / measured - 1) <= 0.25
    explained_x = sum(v.base_ms for v in e.parts.values()) / sum(v.rung_ms for v in e.parts.values())
    assert explained_x == pytest.approx(measured)
    assert e.grew == "elementwise & norm" and e.culprit == "tail" and "C++ loops" in e.note
    r = RungResult(name="compile", rung="compile", role="rung", reason="", kind="speed", built_on="eager",
                   spec=StepSpec(16, 64), precision="fp32", requirement={}, status="ok", speedup_prev=measured, prediction_error=-0.33,
                   predicted=Prediction(1.17, "fusion"),
                   explanation=dataclasses.replace(e, rungs=["eager", "compile"], base_rungs=["eager"],
                                                   trace="trace-compile.json", base_trace="trace-eager.json"))
    assert r.explanation is not None
    text = " ".join(lines_of(r, r.explanation))
    assert text.startswith("compile lost: 0.78× eager where 1.17× was predicted (-33%)")
    assert "adds up to the timed ratio" in text
    assert "the category that grew most: elementwise & norm +" in text
    assert "3 graph(s), 1 graph break(s) (1× Tensor.item() call), 1 recompile(s) after the first step" in text
    assert "kernels a step: 1,328 operators before, 383 after (31 fused C++ loops and 39 library calls" in text
    assert "trace trace-compile.json beside trace-eager.json (eager)" in text and "ui.perfetto.dev" in text


def test_kernel_calls_are_read_from_inductors_generated_code(tmp_path, monkeypatch):
    """Counted in the `call` function of each module inductor loaded: its fused kernels and its library calls."""
    import types

    from torch._inductor.codecache import PyCodeCache

    from speedladder.measure import counters

    source = tmp_path / "graph.py"
    source.write_text("def helper(x):\n    cpp_fused_not_counted_9(x)\n\n\ndef call(args):\n"
                      "    primals_1, = args\n    buf0 = empty_strided_cpu((4, 4), (4, 1), torch.float32)\n"
                      "    cpp_fused_add_0(primals_1, buf0)\n    extern_kernels.mm(buf0, primals_1, out=buf0)\n"
                      "    buf1 = torch.ops.aten.gelu.default(buf0)\n    triton_poi_fused_mul_1.run(buf1, grid=g)\n"
                      "    return (buf1, )\n\n\ndef benchmark_compiled_module():\n    cpp_fused_x_2(1)\n")
    runner = tmp_path / "runner.py"  # torch 2.13 writes `call` as a method of a runner class
    runner.write_text("class Runner:\n    def call(self, args):\n        cpp_fused_add_0(args[0])\n"
                      "        extern_kernels.bmm(args[0], args[1], out=args[2])\n\n"
                      "    def other(self):\n        cpp_fused_not_counted_1(1)\n")
    modules = [types.ModuleType("older"), types.ModuleType("graph"), types.ModuleType("runner")]
    modules[1].__file__, modules[2].__file__ = str(source), str(runner)
    monkeypatch.setattr(PyCodeCache, "modules", modules)
    assert counters.kernel_calls(1) == {"fused": 3, "library": 3}
    assert counters.kernel_calls(3) is None  # nothing loaded since: nothing to read


@pytest.mark.slow
def test_a_compiled_profile_records_what_the_compiler_did_and_its_own_trace(tmp_path):
    from speedladder.config.run import RunConfig
    from speedladder.profile import step_profile

    run = RunConfig(preset="tiny", device="cpu", rungs=("eager",), profile=dataclasses.replace(
        RunConfig().profile, steps=2))
    (b,) = step_profile.profiles_in_child(run, [("compile",)], timeout_s=600, facts=False,
                                   traces=[tmp_path / "trace-compile.json"])
    c = b["compiler"]
    assert c["graphs"] >= 1 and c["graph_breaks"] >= 0 and c["recompiles"] >= 0  # dynamo's (the backward is AOT's)
    assert c["kernel_calls"]["fused"] > 0 and c["kernel_calls"]["library"] > 0
    assert b["trace"] == "trace-compile.json" and step_profile.valid_trace(tmp_path / "trace-compile.json") > 0


def test_only_misses_beyond_the_limit_are_explained_and_chains_follow_the_ladder():
    res = Results(schema="", status="", created="", command=[], config=resolved(), environment=Environment(), model=SavedModel(),
                  rungs=[_rung("eager", None, None), _rung("compile", "eager", -0.36), _rung("bf16", "compile", 0.1),
                         _rung("batch", "bf16", -0.25), _rung("batch-fp32", "batch", 0.9, role="control"),
                         _rung("ckpt", "batch", 0.64)])
    res.rungs[4].rung = "batch"
    assert [r.name for r in to_explain(res, 0.25)] == ["compile", "ckpt"]
    assert names_of(res, res.rung("ckpt")) == ["eager", "compile", "bf16", "batch", "ckpt"]
    assert names_of(res, res.rung("eager")) == ["eager"]


@pytest.mark.slow
def test_a_run_with_a_miss_shows_the_side_by_side_table_and_names_the_part(tmp_path, capsys):
    # --explain-miss 0.0001: any prediction error explains the rung, so the tiny ladder's ckpt is profiled.
    rc = main(["run", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,ckpt", "--window-steps", "2",
               "--loss-steps", "4", "--learns-steps", "0", "--no-process-peak", "--profile-steps", "2",
               "--explain-miss", "0.0001", "--out", str(tmp_path)])
    assert rc == 0
    (folder,) = [p for p in Path(tmp_path).iterdir() if p.is_dir()]
    ckpt = {r["name"]: r for r in json.loads((folder / "results.json").read_text())["rungs"]}["ckpt"]
    e = ckpt["explanation"]
    assert e["rungs"] == ["eager", "ckpt"] and e["base_rungs"] == ["eager"]
    assert set(e["categories"]) == set(CATEGORIES) and e["culprit"] in e["parts"]
    assert all(v["rung_ms"] >= 0 for v in e["categories"].values())
    # Against the timed figures, with a trace of each profiled spec beside results.json.
    assert e["basis"] == "timed" and e["timed"]["x"] == pytest.approx(ckpt["speedup_prev"])
    assert e["trace"] == "trace-ckpt.json" and (folder / "trace-ckpt.json").exists()
    # Like with like: the base profiled again beside the rung, in the same child, not the baseline's earlier one.
    assert e["base_trace"] == "trace-eager.json" and (folder / "trace-eager.json").exists()
    out, err = capsys.readouterr()
    assert "rung ms" in out and "model's Δ ms" in out and e["note"] in out
    # The profiles in their child show their progress while they run, against the baseline's profile's time.
    what = "explain profiling eager, ckpt in a child process, one after the other"
    assert f"{what} (about " in err and f"{what}: done in " in err


def test_compile_fusion_saves_only_the_time_the_bytes_account_for(tiny):
    """The written model's change learned from the misses: fusion's cut in bytes pays in proportion to how much of
    the tail's time those bytes take at the copy bandwidth measured here."""
    from speedladder.profile import predict

    ms = {"matmul": 50.0, "elementwise & norm": 30.0, IDLE: 20.0}
    p = from_dict(ProfileSummary, profile(ms))
    base = StepSpec(16, 64)
    old = predict.chain(p, ["compile"], base, tiny.env)[0].speedup
    assert old == pytest.approx(100 / (50 + 30 / 3 + 20 / 3))  # no bandwidths: the model as it was
    p.memory_gbps, p.copy_gbps = 10.0, 100.0  # the tail moves 10% of the bytes a copy could: bytes are 10% of it
    new = predict.chain(p, ["compile"], base, tiny.env)[0]
    assert new.speedup == pytest.approx(100 / (50 + 30 * (1 - 2 / 3 * 0.1) + 20 / 3))
    assert "10%" in new.reason


def test_an_explanation_is_saved_with_the_keys_it_always_had():
    """Made: its rungs, the comparison, its traces, in that order, and no error key; not made: its error alone."""
    from speedladder.records import ProfiledExplanation, to_dict

    base = profile(BASE)
    before = baseline_parts(from_dict(ProfileSummary, base))
    e = dataclasses.replace(compare(base, profile(BASE), before, before, error=0.0), rungs=["eager", "x"],
                            base_rungs=["eager"], trace="t.json", base_trace="b.json")
    saved = to_dict(e)
    assert list(saved) == ["rungs", "base_rungs", "categories", "parts", "culprit", "grew", "note", "basis",
                           "base_step_ms", "rung_step_ms", "base_tokens_per_step", "rung_tokens_per_step",
                           "profiled_x", "timed", "adds_up", "compiler", "ops_per_step", "device_type", "trace",
                           "base_trace"]
    assert to_dict(from_dict(ProfiledExplanation, saved)) == saved
    assert to_dict(ProfiledExplanation(error="over budget")) == {"error": "over budget"}
