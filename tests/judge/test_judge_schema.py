"""The output's JSON Schema ships in the package and holds the object the command prints; the small validator
(judge/report.check) can fail; the wire never unpickles a worker's answer; the guard sees a replaced function."""

from __future__ import annotations

import copy
import json
import os
import time
from importlib import resources

import pytest

from speedladder.config.judge import JudgeConfig
from speedladder.judge import guard, record, report, rule, wire
from speedladder.records import BudgetCheck
from speedladder.spec import StepSpec


def judgement() -> record.Judgement:
    """A judgement as the referee builds one (every part filled), without running one."""
    cfg = JudgeConfig()
    spec = StepSpec(4, 32)
    look = rule.look([-0.40, -0.41, -0.42], [-0.40, -0.41, -0.42], cfg)
    side = record.SideRecord("eager", "eager fp32", "eager", [], {}, spec, "fp32", None)
    cand = record.SideRecord("lr3", "lr3.py", "rung-file", ["lr-3x"], {"lr-3x": "optimizer"}, spec, "fp32", None)
    budget = BudgetCheck(25600, [2.4, 2.39, 2.38], 2.39, 0.2, False)
    return record.Judgement(
        decision=look.decision or "undecided", why=look.why or "budget", detail="1.6x", candidate=cand, base=side,
        effect=record.Effect(look.speedup, look.bound, list(look.interval), look.confidence, look.p_win, look.p_loss,
                             look.p_short, [1.5, 1.6, 1.65]),
        criterion=record.Criterion(2.4, 25600, budget, budget),
        speed=record.Speed(46000.0, 46500.0, 0.99, 0.42, 0.66, 0.64), target=2.4, target_from="the base's",
        seeds=record.Seeds(3, 8, [0, 1, 2], [{"seeds": 3, "p_win": look.p_win, "p_loss": look.p_loss,
                                              "p_short": look.p_short, "speedup": look.speedup, "decision": "keep"}]),
        rule=record.Rule(0.01, 0.05, 0.1, 0.03, 3, 8, 6, 0.01 / 6, 0.05 / 6, 600.0), gate=None,
        cost=record.Cost(12.0, 4.0, 0.1, 1.0, 0.7, 6.0), run_dir="runs/x", speedladder="0.1.0", torch="2.13.0",
        loadavg=1.0)


def test_the_schema_ships_in_the_package_and_is_a_json_schema():
    text = resources.files("speedladder.judge").joinpath("schema.json").read_text()
    schema = json.loads(text)
    assert schema == report.schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert set(schema["required"]) == set(schema["properties"])  # every field always there (null where empty)
    fields = {f for f in record.Judgement.__dataclass_fields__}
    assert set(schema["properties"]) == fields  # the schema and the record say the same fields


def test_a_judgement_validates():
    doc = report.document(judgement())
    assert doc["decision"] == "keep" and report.check(doc) == []
    assert json.loads(report.to_json(judgement())) == doc


@pytest.mark.parametrize("change, says", [
    (lambda d: d.pop("why"), "'why' is missing"),
    (lambda d: d.update(decision="maybe"), "is not one of ['keep', 'revert', 'undecided']"),
    (lambda d: d.update(why="because"), "does not match"),
    (lambda d: d.update(surprise=1), "'surprise' is not a field of it"),
    (lambda d: d["effect"].update(p_win=1.5), "is above 1"),
    (lambda d: d["effect"].update(interval=[1.0]), "fewer than 2 items"),
    (lambda d: d["candidate"].update(kind="plugin"), "$.candidate.kind"),
    (lambda d: d["seeds"].update(used="three"), "$.seeds.used: str where integer is allowed"),
    (lambda d: d.update(schema=2), "is not 1"),
])
def test_the_validator_refuses_what_the_schema_refuses(change, says):
    doc = copy.deepcopy(report.document(judgement()))
    change(doc)
    errors = report.check(doc)
    assert errors and any(says in e for e in errors), errors


def test_the_validator_refuses_a_schema_keyword_it_does_not_read():
    with pytest.raises(ValueError, match="does not read"):
        report.check({}, {"type": "object", "patternProperties": {}})


def test_an_answer_is_json_never_a_pickle():
    r, w = os.pipe()
    try:
        os.write(w, wire.HEADER.pack(4) + b"\x80\x04N.")  # a pickle of None: refused, never loaded
        with pytest.raises(wire.WireError, match="not JSON"):
            wire.read_answer(r, 1.0, "the test worker")
        os.write(w, wire.HEADER.pack(2) + b"[]")
        with pytest.raises(wire.WireError, match="where an answer is an object"):
            wire.read_answer(r, 1.0, "the test worker")
        os.write(w, wire.HEADER.pack(wire.MAX_ANSWER + 1))
        with pytest.raises(wire.WireError, match="where an answer is a few thousand"):
            wire.read_answer(r, 1.0, "the test worker")
        started = time.monotonic()
        with pytest.raises(wire.WireError, match="did not answer in time"):
            wire.read_answer(r, 0.2, "the test worker")
        assert time.monotonic() - started < 2
    finally:
        os.close(r)
        os.close(w)


def test_the_guard_sees_a_replaced_function_and_a_changed_setting(monkeypatch):
    import torch

    before, state = guard.snapshot(), guard.numeric_state()
    assert "time.perf_counter" in before and "speedladder.step.train_step.TrainStep.evaluate" in before
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    monkeypatch.setattr(torch.nn.functional, "cross_entropy", lambda *a, **k: 0.0)
    now = guard.snapshot()
    assert sorted(k for k, v in before.items() if now.get(k) is not v) == [
        "time.perf_counter", "torch.nn.functional.cross_entropy"]
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        assert guard.numeric_state() != state
    finally:
        torch.set_float32_matmul_precision(previous)
    assert guard.numeric_state() == state
