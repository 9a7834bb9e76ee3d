"""compare (runs side by side) and check (speed as a CI step) on real tiny runs and doctored copies of them."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY, load_dict

from speedladder.cli import cmd_check, main
from speedladder.config.ladders import FULL_LADDER
from speedladder.config.resolved import resolve
from speedladder.config.settings import DRIFT_LIMIT
from speedladder.records import storage
from speedladder.report import compare
from speedladder.rungs import RUNGS

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "example-cpu-results.json"


def tiny_run(out: Path, *flags: str) -> Path:
    assert main(["run", *TINY, *flags, "--out", str(out)]) == 0
    (run,) = out.iterdir()
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_thread) -> tuple[Path, Path]:
    """A: eager,bf16 at the preset's batch; B: eager,sdpa at batch 8 (other rungs, other shape)."""
    base = tmp_path_factory.mktemp("runs")
    return tiny_run(base / "a", "--rungs", "eager,bf16"), tiny_run(base / "b", "--rungs", "eager,sdpa",
                                                                     "--batch-size", "8")


def scale_speed(saved: dict, factor: float, names: set[str] | None = None) -> dict:
    """A copy whose rungs (all, or those named) ran `factor` times as fast: every window and derived rate."""
    out = copy.deepcopy(saved)
    for r in out["rungs"]:
        if r["status"] != "ok" or (names is not None and r["name"] not in names):
            continue
        for w in r["timing"]["windows"]:
            w["seconds"] /= factor
        r["tokens_per_s"] = {k: v * factor for k, v in r["tokens_per_s"].items()}
        r["step_ms"] /= factor
    return out


def doctored(saved: dict, folder: Path) -> Path:
    folder.mkdir(parents=True)
    storage.save(saved, folder)
    return folder


@pytest.mark.slow
def test_compare_marks_an_injected_slowdown_and_nothing_else(runs, tmp_path):
    a, b = runs
    saved = load_dict(a)
    slow = doctored(scale_speed(saved, 0.8, {"bf16"}), tmp_path / "slow")
    comp = compare.load([str(a), str(slow), str(b)])
    assert comp.labels == (a.name, "slow", b.name)
    ref = saved_rung(saved, "bf16")["tokens_per_s"]
    cell = comp.row("bf16").cells[1]
    assert cell.ratio == pytest.approx(0.8)
    assert cell.median == pytest.approx(0.8 * ref["median"])
    # Slower exactly when the slowed windows no longer overlap the original ones (the ladder's verdict rule).
    assert cell.change == (compare.SLOWER if 0.8 * ref["max"] < ref["min"] else compare.WITHIN)
    eager = comp.row("eager").cells[1]
    assert eager.ratio == 1.0 and eager.change == compare.WITHIN and eager.gate_change is None
    # Aligned by name: each run lacks the other's second rung.
    assert comp.row("sdpa").cells[0].status == "missing" and comp.row("sdpa").cells[2].status == "ok"
    assert comp.row("bf16").cells[2].status == "missing" and comp.row("bf16").cells[2].ratio is None
    assert comp.difference("batch size").values == ("4", "4", "8")
    assert comp.difference("rungs").values == ("eager,bf16", "eager,bf16", "eager,sdpa")
    assert comp.difference("device") is None and comp.difference("torch") is None


def saved_rung(saved: dict, name: str) -> dict:
    return next(r for r in saved["rungs"] if r["name"] == name)


def test_a_20_percent_slowdown_outside_tight_windows_is_marked_slower(tmp_path):
    """The saved CPU example's windows lie within 4% of their median: a 20% slowdown is outside them."""
    saved = json.loads(EXAMPLE.read_text())
    base = doctored(saved, tmp_path / "base")
    slow = doctored(scale_speed(saved, 0.8, {"batch"}), tmp_path / "slow")
    comp = compare.load([str(base), str(slow)])
    assert [r.rung for r in comp.rows if r.changed] == ["batch"]
    assert comp.row("batch").cells[1].change == compare.SLOWER
    assert comp.row("batch").cells[1].ratio == pytest.approx(0.8)
    for row in comp.rows:
        if row.rung != "batch":
            assert row.cells[1].ratio == 1.0 and row.cells[1].change == compare.WITHIN
    assert comp.differences == ()


@pytest.mark.slow
def test_compare_marks_gate_changes_both_ways(runs, tmp_path):
    a, _ = runs
    saved = load_dict(a)
    failed = copy.deepcopy(saved)
    saved_rung(failed, "bf16")["gate"].update(passed=False, detail="logits differ")
    bad = doctored(failed, tmp_path / "bad")
    assert compare.load([str(a), str(bad)]).row("bf16").cells[1].gate_change == "passed -> failed"
    back = compare.load([str(bad), str(a)]).row("bf16").cells[1]
    assert back.gate_change == "failed -> passed" and back.gate == compare.PASSED


@pytest.mark.slow
def test_compare_command_prints_and_writes_html(runs, tmp_path, capsys):
    a, b = runs
    page = tmp_path / "cmp.html"
    assert main(["compare", str(a), str(b), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "sdpa" in out and "bf16" in out and "missing" in out
    text = page.read_text()
    assert 'id="comparison"' in text and 'id="differences"' in text and "<script" not in text


@pytest.mark.slow
def test_check_passes_against_itself(runs, capsys):
    a, _ = runs
    assert main(["check", "--baseline", str(a), "--against", str(a), "--tolerance", "0.2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # On a busy host the fixture's tiny windows may drift; a warning then names each side, and only then.
    typed = storage.load(a)
    warned = compare.drift_warnings([typed, typed], ["the baseline", "the new run"], DRIFT_LIMIT)
    assert lines[:-1] == [f"check: {w}" for w in warned]
    assert lines[-1].startswith("check: no regression")


@pytest.mark.slow
def test_check_fails_against_a_baseline_30_percent_faster(runs, tmp_path, capsys):
    a, _ = runs
    saved = load_dict(a)
    fast = doctored(scale_speed(saved, 1 / 0.7), tmp_path / "fast")
    rc = main(["check", "--baseline", str(fast), "--against", str(a)])
    out = capsys.readouterr().out.strip().splitlines()
    # The rule, in numbers: a rung regresses when its median is below the faster baseline's minimum less 5%.
    expected = {r["name"] for r in saved["rungs"] if r["status"] == "ok"
                and r["tokens_per_s"]["median"] < r["tokens_per_s"]["min"] / 0.7 * 0.95}
    # A rung's median is nearly always within 33% of its own slowest window, so it regresses; but a window of 2
    # steps on a shared machine can fall far below the rest and widen one rung's range past that. At least one
    # rung must be left to regress, or the check could not fail.
    assert expected
    found, _ = cmd_check.regressions(json.loads((fast / "results.json").read_text()), saved, 0.05)
    assert {r.rung for r in found} == expected and {r.kind for r in found} == {"speed"}
    for r in found:
        base_min = saved_rung(saved, r.rung)["tokens_per_s"]["min"] / 0.7
        assert r.threshold == pytest.approx(base_min * 0.95) and r.new_median < r.threshold
    assert rc == 1
    assert len([ln for ln in out if ln.startswith("check: regression: ")]) == len(expected)


@pytest.mark.slow
def test_check_fails_when_a_gate_that_passed_fails(runs, tmp_path, capsys):
    a, _ = runs
    failed = copy.deepcopy(load_dict(a))
    saved_rung(failed, "bf16")["gate"].update(passed=False, detail="logits differ")
    bad = doctored(failed, tmp_path / "bad")
    assert main(["check", "--baseline", str(a), "--against", str(bad), "--tolerance", "0.2"]) == 1
    found, _ = cmd_check.regressions(load_dict(a), failed, 0.2)
    assert [(r.rung, r.kind) for r in found] == [("bf16", "gate")]
    assert sum(ln.startswith("check: regression: bf16") for ln in capsys.readouterr().out.splitlines()) == 1


@pytest.mark.parametrize("make, args", [
    (lambda d: None, []),  # no results.json at all
    (lambda d: (d / "results.json").write_text("{not json"), []),
    (lambda d: (d / "results.json").write_text(json.dumps({"schema": "other"})), []),
    (lambda d: shutil.copy(EXAMPLE, d / "results.json"), ["--tolerance", "1.5"]),
    (lambda d: (d / "results.json").write_text(json.dumps({"schema": storage.SCHEMA, "rungs": []})), []),
])
def test_bad_baseline_is_one_line_and_exit_2(make, args, tmp_path, capsys):
    base = tmp_path / "base"
    base.mkdir()
    make(base)
    rc = main(["check", "--baseline", str(base), "--against", str(EXAMPLE), *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("speedladder: error: ")


@pytest.mark.slow
def test_the_rerun_resolves_to_the_saved_config(runs, tmp_path):
    """What check runs again is the saved config through the codec, and its config file reads back the same."""
    from speedladder import codec
    from speedladder.config import settings

    a, _ = runs
    saved = load_dict(a)
    for config in (saved["config"], {**saved["config"], "ladder": "full", "rungs": list(FULL_LADDER),
                                     "beside": ["ckpt"]}):
        command, again = cmd_check.rerun_settings({**saved, "config": config})
        path = settings.write(tmp_path / "config.toml", again, "check", ("run", "race"))
        read = codec.from_data(settings.Settings, settings.read(path))
        assert command == "run" and read == again
        resolved = resolve(read.run, torch.device("cpu"), tuple(RUNGS)).with_vocab(config["model"]["vocab_size"])
        assert json.loads(json.dumps(codec.to_data(resolved, json=True))) == config


@pytest.mark.slow
def test_check_reruns_the_baseline_here(runs, tmp_path, capsys):
    a, _ = runs
    rc = main(["check", "--baseline", str(a), "--tolerance", "0.2", "--out", str(tmp_path / "new"), "--quiet"])
    (new_dir,) = (tmp_path / "new").iterdir()
    new, saved = load_dict(new_dir), load_dict(a)
    assert {k: v for k, v in new["config"].items() if k != "out"} == \
           {k: v for k, v in saved["config"].items() if k != "out"}
    assert [r["name"] for r in new["rungs"]] == [r["name"] for r in saved["rungs"]]
    found, _ = cmd_check.regressions(saved, new, 0.2)
    assert rc == (1 if found else 0)
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("check: ")
