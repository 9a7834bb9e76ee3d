"""Miss attribution on saved profiles: which part of the step moved against the prediction, and by how much."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import resolved

from speedladder.cli import main
from speedladder.profile.categories import CATEGORIES, IDLE
from speedladder.profile.explain import compare, misses, names_of
from speedladder.profile.predict import baseline_parts
from speedladder.records import ProfileSummary, Results, RungResult, from_dict


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
    assert e["culprit"] == "tail"
    tail = e["parts"]["tail"]
    assert round(tail["rung_ms"] - tail["base_ms"], 6) == 3.3
    assert round(tail["expected_ms"] - tail["base_ms"], 6) == round(-4.0 * 2 / 3, 6)  # 4 ms of tail, 2/3 fused away
    assert "+3.30 ms" in e["note"] and "-2.67 ms" in e["note"] and "C++ loops" in e["note"]
    assert e["categories"]["elementwise & norm"] == {"base_ms": 3.0, "rung_ms": 6.3}
    assert e["base_step_ms"] == 20.0 and round(e["rung_step_ms"], 6) == 22.3


def test_a_rung_faster_than_predicted_names_the_part_that_saved_most_beyond_it():
    base = profile(BASE)
    rung = profile({**BASE, "matmul": 12.0, "optimizer": 0.5})  # matmuls cost more, optimizer far less
    before = baseline_parts(from_dict(ProfileSummary, base))
    after = {k: v * 4 / 3 for k, v in before.items()}  # a checkpoint-like prediction: everything 1/3 dearer
    e = compare(base, rung, before, after, error=+0.6)
    assert e["culprit"] == "optimizer"  # -1.5 ms where +0.67 ms was expected: the largest saving against it
    opt = e["parts"]["optimizer"]
    assert round(opt["rung_ms"] - opt["base_ms"], 6) == -1.5 and round(opt["expected_ms"] - opt["base_ms"], 6) == round(
        2.0 / 3, 6)


def test_predicted_parts_are_rescaled_to_the_base_profile():
    base = profile({k: 2 * v for k, v in BASE.items()})  # the base measured twice as slow as the model's parts
    before = baseline_parts(from_dict(ProfileSummary, profile(BASE)))
    after = {**before, "matmul": before["matmul"] / 2}
    e = compare(base, profile({k: 2 * v for k, v in BASE.items()}), before, after, error=-0.5)
    assert round(e["parts"]["matmul"]["expected_ms"] - e["parts"]["matmul"]["base_ms"], 6) == -10.0  # -5 ms x 2


def _rung(name: str, built_on: str | None, error: float | None, role: str = "rung") -> RungResult:
    return RungResult(name=name, rung=name, role=role, reason="", kind="speed", built_on=built_on, spec={},
                      precision="fp32", requirement={}, status="ok", prediction_error=error)


def test_only_misses_beyond_the_limit_are_explained_and_chains_follow_the_ladder():
    res = Results(schema="", status="", created="", command=[], config=resolved(), environment={}, model={},
                  rungs=[_rung("eager", None, None), _rung("compile", "eager", -0.36), _rung("bf16", "compile", 0.1),
                         _rung("batch", "bf16", -0.25), _rung("batch-fp32", "batch", 0.9, role="control"),
                         _rung("ckpt", "batch", 0.64)])
    res.rungs[4].rung = "batch"
    assert [r.name for r in misses(res, 0.25)] == ["compile", "ckpt"]
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
    out, err = capsys.readouterr()
    assert "rung ms" in out and "model's Δ ms" in out and e["note"] in out
    # The profiles in their child show their progress while they run, against the baseline's profile's time.
    what = "explain profiling ckpt in a child process, one after the other"
    assert f"{what} (about " in err and f"{what}: done in " in err


def test_compile_fusion_saves_only_the_time_the_bytes_account_for(tiny):
    """The written model's change learned from the misses: fusion's cut in bytes pays in proportion to how much of
    the tail's time those bytes take at the copy bandwidth measured here."""
    from speedladder.profile import predict
    from speedladder.rungs import StepSpec

    ms = {"matmul": 50.0, "elementwise & norm": 30.0, IDLE: 20.0}
    p = from_dict(ProfileSummary, profile(ms))
    base = StepSpec(16, 64)
    old = predict.chain(p, ["compile"], base, tiny.env)[0].speedup
    assert old == pytest.approx(100 / (50 + 30 / 3 + 20 / 3))  # no bandwidths: the model as it was
    p.memory_gbps, p.copy_gbps = 10.0, 100.0  # the tail moves 10% of the bytes a copy could: bytes are 10% of it
    new = predict.chain(p, ["compile"], base, tiny.env)[0]
    assert new.speedup == pytest.approx(100 / (50 + 30 * (1 - 2 / 3 * 0.1) + 20 / 3))
    assert "10%" in new.reason
