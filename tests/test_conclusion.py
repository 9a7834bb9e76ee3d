"""The conclusion a run ends with (docs/report.md): what paid, what did not and why, the next two commands; on
planted runs, read from the saved file alone."""

from __future__ import annotations

import io

import pytest
from conftest import resolved
from rich.console import Console

from speedladder import results
from speedladder.cli import main
from speedladder.measure.judging import Spread
from speedladder.records import (
    CorpusRecord,
    Environment,
    Gate,
    LearnsCheck,
    Prediction,
    ProfiledExplanation,
    ProfileSummary,
    Results,
    RungResult,
    SavedModel,
)
from speedladder.report import conclusion, html
from speedladder.report.text import print_report
from speedladder.spec import StepSpec

BF16_WHY = ("matmuls 33% of the step; in bf16 they run at 0.06x their fp32 speed at this model's shapes (measured "
            "here, casts included); this CPU has no native bf16 -> bf16 ≈ 0.10x")
COMPILE_NOTE = ("elementwise, norm and softmax tail (inductor's fused C++ loops): +9.10 ms a step where the model "
                "expected -1.20 ms")


def rung(name: str, tokens: float, prev: float | None, built_on: str | None, verdict: str, kind: str = "speed",
         predicted: float | None = None, why: str = "", gate: bool | None = True, **kw) -> RungResult:
    r = RungResult(name=name, rung=name, role="rung", reason=f"{name}'s reason", kind=kind, built_on=built_on,
                   spec=StepSpec(16, 64), precision=kw.pop("precision", "fp32"), requirement={}, status="ok")
    r.tokens_per_s, r.speedup_prev, r.verdict = Spread(tokens, tokens * 0.95, tokens * 1.05), prev, verdict
    r.step_ms, r.speedup_cum = 16 * 64 / tokens * 1e3, kw.pop("speedup_cum", prev)
    r.gate = None if gate is None else Gate(passed=gate, reference=built_on is None)
    r.predicted = Prediction(predicted, why) if predicted else None
    if predicted and prev:
        r.prediction_error = prev / predicted - 1
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def nothing_paid() -> Results:
    """The AVX2 processor's default run: compile lost, bf16 stopped short at a tenth, batch was noise below 1.0x,
    checkpointing cost speed as a memory rung does; the fastest that passed every gate is eager."""
    rungs = [
        rung("eager", 20_000, None, None, "baseline", speedup_cum=1.0),
        rung("compile", 17_400, 0.87, "eager", "loss", predicted=1.13, why="fusion", not_built_upon="slower: a loss",
             explanation=ProfiledExplanation(note=COMPILE_NOTE, base_rungs=["eager"], base_step_ms=60.0,
                                             rung_step_ms=69.1)),
        rung("bf16", 1_600, 0.08, "eager", "short", predicted=0.10, why=BF16_WHY, gate=None, precision="bf16",
             not_built_upon="slower: 0.08x in one short window"),
        rung("batch", 19_000, 0.95, "eager", "noise", predicted=1.3, why="per-step costs",
             not_built_upon="slower: noise"),
        rung("ckpt", 16_000, 0.80, "eager", "loss", kind="memory", predicted=0.78, why="recompute"),
    ]
    env = Environment(device_name="AMD EPYC", device_type="cpu", torch="2.13.0+cpu", cpu_capability="AVX2",
                      bf16_native=False)
    profile = ProfileSummary(regime="compute-bound", regime_label="borderline (compute / memory)",
                             buckets={"compute": 0.45, "memory": 0.40, "overhead": 0.15})
    return Results(schema=results.SCHEMA, status="complete", created="2026-12-03T00:00:00+00:00", command=["x"],
                   config=resolved(), environment=env, model=SavedModel(kind="speedladder"),
                   corpus=CorpusRecord(source="timemachine"), rungs=rungs, fastest="eager", profile=profile,
                   learns_check=LearnsCheck(rung="eager", passed=True))


def test_a_run_in_which_nothing_paid_says_so_why_and_two_commands(tmp_path, capsys):
    res = nothing_paid()
    c = conclusion.of(res, "RUNS/x")
    assert c is not None and c.nothing_paid and not c.paid
    assert c.headline.startswith("nothing paid on this machine: no rung ran faster than eager")
    # What did not pay, each with its own reason: its explanation, its prediction (stopped short), its speed.
    why = {line.split(":", 1)[0]: line for line in c.not_paid}
    assert set(why) == {"compile", "bf16", "batch", "ckpt"}
    assert "0.87× eager (predicted 1.13×), loss" in why["compile"] and COMPILE_NOTE in why["compile"]
    assert "0.08× eager (predicted 0.10×) in one short window" in why["bf16"] and "no native bf16" in why["bf16"]
    assert "ckpt" in why and "a memory rung" in why["ckpt"]
    assert "borderline (compute / memory): compute 45%" in c.regime
    # What would change it, from the processor, the ladder, the preset and the model.
    changes = " ".join(c.change)
    for words in ("native bf16", "--ladder full", "--preset d2l-512", "your own model", "a GPU"):
        assert words in changes
    # Two commands worth running here, chosen from what was measured; never a race of eager against eager.
    assert len(c.commands) == 2 and len({cmd for cmd, _ in c.commands}) == 2
    assert c.commands[0][0] == "speedladder run --ladder full" and c.commands[1][0] == "speedladder race"
    assert "Muon" in c.commands[1][1]  # a rung that pays in time to a loss: the default race's, not this ladder's
    assert all("--run" not in cmd and "train" not in cmd for cmd, _ in c.commands)

    out = Console(file=io.StringIO(), width=160)
    print_report(res, out, folder="RUNS/x")
    printed = out.file.getvalue().splitlines()  # type: ignore[attr-defined]
    tail = printed[-(len(conclusion.lines(c))):]
    assert tail[0].startswith("conclusion: nothing paid") and tail[-2].startswith("next: speedladder run --ladder full")
    assert tail[-1].startswith("next: speedladder race ")

    page = html.build(res)
    summary = page.split('id="summary"', 1)[1].split("</section>", 1)[0]
    assert "nothing paid on this machine" in summary and "speedladder run --ladder full" in summary
    assert "speedladder race --run" not in summary and "nothing to race against eager" in summary

    results.save(res, tmp_path)
    assert main(["race", "--run", str(tmp_path), "--out", str(tmp_path / "races")]) == 2
    err = capsys.readouterr().err.strip()
    assert "fastest configuration is eager: nothing there paid" in err and len(err.splitlines()) == 1


def test_a_run_that_paid_names_what_paid_and_races_and_trains_it():
    res = nothing_paid()
    batch = rung("batch", 30_000, 1.5, "eager", "win", predicted=1.3, why="per-step costs", speedup_cum=1.5)
    res.rungs[3], res.fastest = batch, "batch"
    c = conclusion.of(res, "RUNS/x")
    assert c is not None and not c.nothing_paid and not c.change
    assert c.headline.startswith("batch paid most: 1.50× eager in tokens/s")
    assert c.paid == ["batch 1.50× eager (win)"]
    assert [cmd for cmd, _ in c.commands] == ["speedladder race --run RUNS/x", "speedladder train --run RUNS/x"]
    assert "more tokens" in c.commands[0][1]  # the batch rung changes how it learns: the race says whether it pays


def test_a_gain_inside_the_noise_is_no_claim():
    """Built upon (its best estimate above 1.0x), claimed by no test: the conclusion says nothing paid."""
    res = nothing_paid()
    res.rungs[3] = rung("batch", 21_000, 1.05, "eager", "noise", predicted=1.3, why="per-step costs", speedup_cum=1.05)
    res.fastest = "batch"
    c = conclusion.of(res)
    assert c is not None and c.nothing_paid and c.change
    assert c.headline.startswith("nothing paid beyond the noise on this machine: batch ran 1.05× eager")
    assert c.paid == ["batch 1.05× eager (noise)"] and c.commands[0][0] == "speedladder run --ladder full"
    assert "  built upon, no gain claimed: batch 1.05× eager (noise)." in conclusion.lines(c)


@pytest.mark.parametrize("regime, overhead, device, expected", [
    ("overhead-bound", 0.6, "cpu", ["speedladder run --batch-size 64", "speedladder race"]),
    ("compute-bound", 0.1, "cpu", ["speedladder race", "speedladder sweep --batch-sizes 16,32,64"]),
    ("compute-bound", 0.1, "cuda", ["speedladder run --preset d2l-512", "speedladder race"]),
])
def test_the_commands_follow_the_profile(regime, overhead, device, expected):
    res = nothing_paid()
    res.config = resolved(ladder="full")
    res.environment.device_type = device
    res.profile = ProfileSummary(regime=regime, buckets={"compute": 0.3, "memory": 0.1, "overhead": overhead})
    c = conclusion.of(res)
    assert c is not None and [cmd for cmd, _ in c.commands] == expected
    assert not any("--ladder full" in cmd for cmd, _ in c.commands)  # climbed already
