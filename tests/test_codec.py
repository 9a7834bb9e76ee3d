"""The one codec (codec.py): configs and results records go to plain data and back under one rule set:
types checked, an unknown key named (or skipped in a saved file, or kept in a record's `extra`), non-finite
numbers null in JSON, the resolved config's decided fields never None and never apart from its run."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from speedladder.codec import from_data, to_data
from speedladder.config.resolved import Resolved, resolve
from speedladder.config.run import RunConfig, TimingConfig
from speedladder.config.settings import RaceConfig, Settings
from speedladder.errors import UsageError
from speedladder.records import Results, Role, RungResult, from_dict, storage, to_dict
from speedladder.spec import StepSpec

EXAMPLES = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("name", ["example-cpu-results.json", "example-race-results.json"])
def test_a_saved_results_file_reads_as_typed_records_and_writes_back_unchanged(name):
    raw = json.loads((EXAMPLES / name).read_text())
    saved = from_dict(Results, raw)
    assert isinstance(saved.config, Resolved) and isinstance(saved.config.run, RunConfig)
    assert saved.config.batch_size == raw["config"]["batch_size"] and saved.config.rungs == tuple(raw["config"]["rungs"])
    assert all(isinstance(r, RungResult) and isinstance(r.role, Role) for r in saved.rungs)
    if saved.race is not None:
        assert isinstance(saved.race.config, RaceConfig) and saved.race.config.seeds == raw["race"]["config"]["seeds"]
    assert _within(raw, to_dict(saved))  # every field read is written back, the flat config included


def test_a_rungs_spec_reads_as_a_step_spec_and_an_old_failed_rungs_empty_spec_as_none(tmp_path):
    raw = json.loads((EXAMPLES / "example-cpu-results.json").read_text())
    saved = from_dict(Results, raw)
    assert [r.spec for r in saved.rungs] == [StepSpec.from_dict(r["spec"]) for r in raw["rungs"]]
    assert all(isinstance(r.spec, StepSpec) and isinstance(r.spec.transforms, tuple) for r in saved.rungs)
    # A file of an earlier version saved a rung whose spec could not be made as {}: it reads as None, not as a
    # spec of defaults, and is written back as null, which reads as None again.
    raw["rungs"][-1].update(spec={}, status="error", detail="its spec could not be made", precision="")
    (tmp_path / "results.json").write_text(json.dumps(raw))
    old = storage.load(tmp_path)
    assert old.rungs[-1].spec is None and old.rungs[0].spec == saved.rungs[0].spec
    storage.save(old, tmp_path)
    assert json.loads((tmp_path / "results.json").read_text())["rungs"][-1]["spec"] is None
    assert storage.load(tmp_path).rungs[-1].spec is None


@dataclasses.dataclass
class _Inner:
    n: int = 1


@dataclasses.dataclass
class _Outer:
    maybe: _Inner | None = None
    always: _Inner = dataclasses.field(default_factory=_Inner)


def test_an_empty_table_is_none_where_none_may_stand_and_the_defaults_where_it_may_not():
    assert from_data(_Outer, {"maybe": {}, "always": {}}) == _Outer(None, _Inner())
    assert from_data(_Outer, {"maybe": {"n": 2}, "always": {"n": 3}}) == _Outer(_Inner(2), _Inner(3))
    assert from_data(_Outer, {"maybe": None}).maybe is None
    assert from_data(RunConfig, {"timing": {}}).timing == TimingConfig()


def _within(part, whole) -> bool:
    """Every key and value of `part` is in `whole` (a file of an older version gains the fields added since)."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and _within(v, whole[k]) for k, v in part.items())
    if isinstance(part, list):
        return isinstance(whole, list) and len(part) == len(whole) and all(map(_within, part, whole))
    return part == whole


def _bad(tmp_path: Path, change) -> str:
    raw = json.loads((EXAMPLES / "example-cpu-results.json").read_text())
    change(raw)
    (tmp_path / "results.json").write_text(json.dumps(raw))
    with pytest.raises(UsageError) as e:
        storage.load(tmp_path)
    return str(e.value)


def test_a_wrong_type_in_a_saved_file_is_one_line_naming_the_field(tmp_path):
    assert "Results.rungs[0].status: expected a string, got 5" in _bad(tmp_path, lambda r: r["rungs"][0].update(status=5))
    assert "Results.rungs[1].role: unknown value 'rung?'" in _bad(tmp_path, lambda r: r["rungs"][1].update(role="rung?"))
    assert "config.batch_size: expected a whole number, got 'x'" in _bad(
        tmp_path, lambda r: r["config"].update(batch_size="x"))
    assert "the resolved config has no seq_len" in _bad(tmp_path, lambda r: r["config"].update(seq_len=None))


def test_unknown_keys_are_named_in_a_users_file_kept_in_a_record_and_skipped_in_a_saved_config():
    with pytest.raises(UsageError, match=r"unknown key 'run.timing.stepz' \(known in run.timing: steps, windows"):
        from_data(Settings, {"run": {"timing": {"stepz": 3}}})
    raw = json.loads((EXAMPLES / "example-cpu-results.json").read_text())
    newer = copy.deepcopy(raw)
    newer["rungs"][0]["from_a_later_version"] = {"kept": [1, 2]}
    newer["config"]["a_removed_flag"] = True
    saved = from_dict(Results, newer)
    assert saved.rungs[0].extra == {"from_a_later_version": {"kept": [1, 2]}}
    back = to_dict(saved)
    assert back["rungs"][0]["from_a_later_version"] == {"kept": [1, 2]} and "a_removed_flag" not in back["config"]


def test_json_has_no_infinity_toml_has_it():
    r = RungResult(name="x", rung="x", role=Role.RUNG, reason="", kind="speed", built_on=None,
                   spec=StepSpec(4, 32), precision="fp32", requirement={}, mfu=math.inf, step_ms=math.nan)
    data = to_data(r, json=True)
    assert data["mfu"] is None and data["step_ms"] is None and data["role"] == "rung"
    assert to_data({"x": math.inf})["x"] == math.inf  # TOML has inf: written as given


def test_a_list_in_a_file_becomes_the_annotated_tuple_and_a_dataclass_is_made_with_its_own_checks():
    t = from_data(RunConfig, {"rungs": ["eager", "bf16"], "timing": {"steps": 3}})
    assert t.rungs == ("eager", "bf16") and t.timing == TimingConfig(steps=3)
    with pytest.raises(UsageError, match="at least 3 timed windows"):
        from_data(RunConfig, {"timing": {"windows": 2}})


def test_the_resolved_configs_decided_fields_are_its_run_and_never_none():
    r = resolve(RunConfig(), torch.device("cpu"))
    assert (r.preset, r.batch_size, r.steps) == (r.run.preset, r.run.batch_size, r.run.timing.steps)
    assert None not in (r.preset, r.data, r.tokenizer, r.batch_size, r.seq_len, r.batch_multiplier, r.steps, r.warmup)
    with pytest.raises(ValueError, match="disagree with its run"):  # a run replaced alone cannot drift from them
        dataclasses.replace(r, run=dataclasses.replace(r.run, batch_size=r.batch_size + 1))
    assert r.with_run(dataclasses.replace(r.run, batch_size=3)).batch_size == 3
    with pytest.raises(UsageError, match="the resolved config has no preset"):
        Resolved.of(RunConfig(), None, None)  # an unresolved RunConfig is not a Resolved
    assert from_data(Resolved, to_data(r, json=True)) == r


def test_a_saved_timing_mirrors_the_timer():
    """records/timing.py mirrors measure/timer.py field for field, in order: what a rung's timing saves is what the
    timer measured, and a field added to one is added to the other."""
    from speedladder.measure.timer import Timing, Window
    from speedladder.records import TimingRecord, WindowRecord

    for kept, measured in ((TimingRecord, Timing), (WindowRecord, Window)):
        assert [f.name for f in dataclasses.fields(kept) if f.name != "extra"] == [
            f.name for f in dataclasses.fields(measured)]
    t = Timing(1.0, [0.5], [False], [Window(0.1, 2, 64, 0, other_cores=0.5, shared=True)], window_steps=2)
    assert to_data(TimingRecord.of(t)) == dataclasses.asdict(t)


def test_records_of_several_shapes_are_saved_as_they_were_read():
    """A record saved with only the keys its kind has (no matmul facts, a step without its optional figures, a tune
    candidate measured or found already measured) is written back with exactly those keys."""
    from speedladder.records import ProfileSummary, TuneSection, from_dict, to_dict

    profile = {"matmuls": {}, "per_step": [{"wall_ms": 1.0, "ops": 3, "ms": {"matmul": 1.0}, "floor_ms": {}},
                                           {"wall_ms": 1.5, "ops": 3, "ms": {}, "floor_ms": {}, "minor_faults": 2}]}
    saved = to_dict(from_dict(ProfileSummary, profile))
    assert saved["matmuls"] == {} and saved["per_step"] == profile["per_step"]
    candidates = [{"name": "c1", "rungs": ["a"], "same_as": "a"}, {"name": "c2", "rungs": ["a", "b"], "status": "ok",
                                                                    "detail": ""}]
    assert to_dict(from_dict(TuneSection, {"candidates": candidates}))["candidates"] == candidates
