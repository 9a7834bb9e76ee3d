"""The conclusion a run ends with (docs/report.md): what paid, what did not and why, the next two commands; on
planted runs, read from the saved file alone."""

from __future__ import annotations

import io
import itertools
import json
import shutil
from pathlib import Path

import pytest
from conftest import interrupt_at_window, resolved
from rich.console import Console

from speedladder.cli import main
from speedladder.ladder import builds_on
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
    storage,
)
from speedladder.report import conclusion, html, summary
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
    return Results(schema=storage.SCHEMA, status="complete", created="2026-12-03T00:00:00+00:00", command=["x"],
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
    assert set(why) == {"compile", "bf16", "batch"}
    assert "0.87× eager (predicted 1.13×), loss" in why["compile"] and COMPILE_NOTE in why["compile"]
    assert "0.08× eager (predicted 0.10×) in one short window" in why["bf16"] and "no native bf16" in why["bf16"]
    (ckpt,) = c.groups[conclusion.MEMORY_RUNGS]  # a memory rung is expected to cost speed: said apart
    assert ckpt.startswith("ckpt: 0.80× eager in tokens/s, a memory rung")
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
    assert "speedladder race --run" not in summary and "<dt>winner</dt>" not in summary  # a winner only where it won

    storage.save(res, tmp_path)
    assert main(["race", "--run", str(tmp_path), "--out", str(tmp_path / "races")]) == 2
    err = capsys.readouterr().err.strip()
    assert "fastest configuration is eager: nothing there paid" in err and len(err.splitlines()) == 1


def test_a_run_that_paid_names_what_paid_and_races_and_trains_it():
    res = nothing_paid()
    batch = rung("batch", 30_000, 1.5, "eager", "win", predicted=1.3, why="per-step costs", speedup_cum=1.5)
    res.rungs[3], res.fastest = batch, "batch"
    res.learns_check = LearnsCheck(rung="batch", passed=True)
    c = conclusion.of(res, "RUNS/x")
    assert c is not None and not c.nothing_paid and not c.change
    assert c.headline == ("the fastest configuration is batch (eager + batch): 1.50× eager in tokens/s, every gate "
                          "passed, and it learns.")
    assert c.paid == ["batch 1.50× eager"]
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
    assert c.groups[conclusion.BUILT] == ["batch 1.05× eager (noise)"] and not c.paid
    assert c.commands[0][0] == "speedladder run --ladder full"
    assert "  built upon, no gain claimed: batch 1.05× eager (noise)." in conclusion.lines(c)


@pytest.mark.parametrize("regime, overhead, device, expected", [
    ("overhead-bound", 0.6, "cpu", ["speedladder run --batch-size 64", "speedladder race"]),
    ("compute-bound", 0.1, "cpu", ["speedladder race", "speedladder sweep --batch-sizes 16,32,64"]),
    ("compute-bound", 0.1, "cuda", ["speedladder run --preset d2l-512", "speedladder race"]),
])
def test_the_commands_follow_the_profile(regime, overhead, device, expected):
    res = nothing_paid()
    res.config = resolved(ladder="full")
    for name in conclusion.untried(res):  # the full ladder's other rungs tried, and skipped here
        res.rungs.append(RungResult(name=name, rung=name, role="rung", reason="", kind="speed", built_on="eager",
                                    spec=None, precision="fp32", requirement={}, status="skipped", detail="needs cuda"))
    res.environment.device_type = device
    res.profile = ProfileSummary(regime=regime, buckets={"compute": 0.3, "memory": 0.1, "overhead": overhead})
    c = conclusion.of(res)
    assert c is not None and [cmd for cmd, _ in c.commands] == expected
    assert not any("--ladder full" in cmd for cmd, _ in c.commands)  # climbed already


# -- the conclusion cannot contradict its table: properties over every combination ---------------------------------

# What a rung's windows said beside its base: its × prev and verdict.
OUTCOMES = {"win": (1.3, "win"), "noise above": (1.03, "noise"), "noise below": (0.98, "noise"), "loss": (0.7, "loss"),
            "short": (0.3, "short")}
# Two speed rungs with a memory rung between them (built upon, it lowers × cum: a win above it can be slower than the
# configuration below it), and an optimizer rung, judged by the race.
LADDER = ("compile", "ckpt", "bf16", "muon")


def climbed(outcomes: tuple[str, ...], gates: tuple[bool, ...], status: str, learns: str) -> Results:
    """A ladder climbed by the ladder's own rule (ladder/builds_on.py): eager, then LADDER with these outcomes and
    gates (ckpt's outcome is a loss, as a memory rung's is); an interrupted run stops during bf16. The learns-check
    as it would be: passed, failed on the fastest (then passed on the next), skipped (--learns-steps 0), or for an
    interrupted run not run at all (a file from before the interrupt path recorded it) or recorded as not run."""
    eager = rung("eager", 10_000, None, None, "baseline", speedup_cum=1.0)
    res = Results(schema=storage.SCHEMA, status=status, created="2026-12-04T00:00:00+00:00", command=["x"],
                  config=resolved(rungs=("eager", *LADDER)), environment=Environment(device_type="cuda"),
                  model=SavedModel(kind="speedladder"), corpus=CorpusRecord(source="timemachine"), rungs=[eager])
    base = eager
    plan = list(zip(LADDER, (outcomes[0], "loss", *outcomes[1:]), gates))
    for name, outcome, gate in plan:
        if status == "interrupted" and name == "bf16":  # stopped during bf16; muon never reached
            cut = RungResult(name=name, rung=name, role="rung", reason="", kind="speed", built_on=base.name,
                             spec=StepSpec(16, 64), precision="bf16", requirement={}, status="interrupted",
                             detail="stopped by Ctrl-C during this rung")
            res.rungs.append(cut)
            break
        prev, verdict = OUTCOMES[outcome]
        kind = "optimizer" if name == "muon" else "memory" if name == "ckpt" else "speed"
        r = rung(name, base.tokens_per_s.median * prev, prev, base.name, verdict, kind=kind,
                 gate=None if verdict == "short" else gate, speedup_cum=(base.speedup_cum or 1.0) * prev)
        res.rungs.append(r)
        if verdict == "short" or (r.passed and not builds_on.pays(r)):
            r.not_built_upon = builds_on.not_built_upon(r, base.name)
        elif r.passed:
            base = r
    ranked = builds_on.ranked(res)
    if status == "interrupted":
        if learns == "recorded":
            res.learns_check = LearnsCheck(skipped=True, detail="the run stopped before the learns-check")
        return res
    if learns == "skipped":
        res.fastest, res.learns_check = ranked[0].name, LearnsCheck(rung=ranked[0].name, skipped=True,
                                                                      detail="--learns-steps 0")
    elif learns == "failed" and len(ranked) > 1:  # the fastest fails it; the next passes
        first = ranked[0]
        assert first.gate is not None
        first.gate.passed, first.gate.detail = False, "learns-check: its loss did not fall"
        res.fastest = ranked[1].name
        res.learns_check = LearnsCheck(rung=ranked[1].name, passed=True, steps=300, first_loss=3.3, final_loss=2.0)
    else:
        res.fastest = ranked[0].name
        res.learns_check = LearnsCheck(rung=ranked[0].name, passed=True, steps=300, first_loss=3.3, final_loss=2.0)
    return res


COMBINATIONS = [(o, g) for o in itertools.product(OUTCOMES, repeat=len(LADDER) - 1)
                for g in itertools.product((True, False), repeat=len(LADDER))]


@pytest.mark.parametrize("status, learns", [("complete", "passed"), ("complete", "failed"), ("complete", "skipped"),
                                            ("interrupted", "none"), ("interrupted", "recorded")])
def test_the_conclusion_never_contradicts_its_table(status, learns):
    """Over every combination of verdicts (win, noise either side of 1.0x, loss, short) and gates (passed, failed) for
    two speed rungs, a memory rung between them and an optimizer rung, complete or interrupted, with each state of the learns-check: no "did not
    pay" line carries a win; what paid is each winning rung of the named configuration with its own × prev; a winner
    is named only where one of its rungs won; "it learns" only where the learns-check passed on it, never where it was
    skipped; an interrupted run names the fastest rung measured through its gates and says the learns-check did not
    run; every rung is said once; and the console and the page say the same sentences."""
    for outcomes, gates in COMBINATIONS:
        res = climbed(outcomes, gates, status, learns)
        c = conclusion.of(res, "RUN_DIR")
        assert c is not None
        where = f"{outcomes} {gates}"
        by_name = {r.name: r for r in res.rungs}
        best = res.rung(res.fastest) if res.fastest else builds_on.ranked(res)[0]
        assert c.best == best.name, where
        chain = [n for n in res.chain(best) if n != "eager"]
        # No "did not pay" line carries a win, nor names a rung that won.
        for line in c.not_paid:
            assert by_name[line.split(":", 1)[0]].verdict != "win" and ", win" not in line, (where, line)
        # What paid: the named configuration's winning rungs, each with its own × prev over its own base.
        won = [by_name[n] for n in chain if by_name[n].verdict == "win"]
        assert c.paid == [f"{r.name} {r.speedup_prev:.2f}× {r.built_on}" for r in won], where
        assert c.nothing_paid == (not won), where
        # A winner only where one of its rungs won: in the headline, on the page's summary box and on the waterfall.
        summary_box = summary.of(res)
        assert summary_box is not None
        assert (summary_box.winner is not None) == (bool(won) and status == "complete"), where
        # "it learns" only where the learns-check passed on the configuration named.
        lc = res.learns_check
        learnt = lc is not None and lc.passed and not lc.skipped and lc.rung == best.name
        assert ("it learns" in c.headline) == (learnt and bool(won)), (where, c.headline)
        if lc is not None and lc.skipped:
            assert not lc.passed and c.learns.startswith("not checked"), where
        if status == "interrupted":
            assert c.interrupted and "stopped during bf16" in c.banner and "not reached: muon" in c.banner
            assert "the learns-check did not run" in c.banner and f"Best so far: {best.name}" in c.banner, where
            assert "nothing here to train" not in c.headline and c.learns.startswith("not checked"), where
            assert c.commands[0][0].startswith("speedladder run --config RUN_DIR/config.toml --rungs "), where
        # Every rung above eager is said once, in one group.
        named = [line.split(":", 1)[0].split(" ", 1)[0] for title, lines in c.groups.items()
                 for line in lines if not line.startswith(("not reached", "skipped here"))]
        said = [r.name for r in res.rungs[1:] if r.status != "skipped"]
        assert sorted(named) == sorted(said), (where, c.groups)
        # One function, two views: every sentence the console prints is on the page.
        page = summary.conclusion_html(c)
        for _, sentence in c.sentences():
            assert html.esc(sentence) in page, (where, sentence)
        printed = "\n".join(conclusion.lines(c))
        for title, line in c.sentences()[1:]:
            assert line in printed, (where, line)


# -- the H200 run of 2026-12-04 at 837fae3, re-rendered ---------------------------------------------------------

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "h200"


def h200(name: str) -> Results:
    return storage.load(H200 / f"{name}.json")


def test_the_h200_runs_cut_by_their_caps_name_their_best_so_far_and_how_to_go_on():
    """The three runs the plan's caps cut (SIGINT): the best rung measured through its gates, what paid with each
    rung's own × prev, where each stopped and what it never reached, the learns-check not run, the command that
    climbs the rest; never "nothing here to train", never a win under "did not pay"."""
    want = {"small": ("bf16", 2.25, ["compile 1.12× eager", "bf16 2.01× compile"], "batch", ["ckpt"],
                      "eager,compile,bf16,batch,ckpt"),
            "gpt2": ("sdpa", 4.91, ["bf16 2.54× eager", "sdpa 1.94× bf16"], "batch", ["fused-adamw", "pad-vocab"],
                     "eager,bf16,sdpa,batch,fused-adamw,pad-vocab"),
            "second-d2l": ("bf16", 2.02, ["bf16 2.02× eager"], "batch", ["ckpt"], "eager,bf16,batch,ckpt"),
            "cuda": ("cudagraphs", 3.46, ["cudagraphs 3.46× bf16"], "max-autotune", [], "bf16,cudagraphs,max-autotune")}
    for name, (best, cum, paid, stopped, left, resume) in want.items():
        res = h200(name)
        assert res.status == "interrupted" and res.fastest is None and res.learns_check is None
        c = conclusion.of(res, "RUN_DIR")
        assert c is not None and c.best == best and c.paid == paid, (name, c.paid)
        assert c.headline.startswith(f"the best so far is {best} (") and f"{cum:.2f}×" in c.headline
        assert "nothing here to train" not in c.headline and "it learns" not in c.headline
        assert c.banner.startswith(f"interrupted: stopped during {stopped} (stopped by Ctrl-C during this rung)")
        assert (f"not reached: {', '.join(left)}" in c.banner) == bool(left)
        assert "the learns-check did not run" in c.banner and f"Best so far: {best}, {cum:.2f}×" in c.banner
        assert c.commands[0][0] == f"speedladder run --config RUN_DIR/config.toml --rungs {resume}"
        assert c.banner.endswith(f"To go on: {c.commands[0][0]}")
        assert c.learns == "not checked: the run stopped before the learns-check"
        assert not any(", win" in line for line in c.not_paid) and "--ladder full" not in " ".join(conclusion.lines(c))
    # cuda: fp8 lost and did not pay; muon is the race's to judge, not a loss in tokens/s.
    c = conclusion.of(h200("cuda"))
    assert c is not None and c.not_paid == ["fp8: 0.22× bf16, loss"]
    (muon,) = c.groups[conclusion.RACE]
    assert muon.startswith("muon: 0.29× cudagraphs in tokens/s, 5.56× fewer tokens to AdamW's loss over 50 batches")
    assert c.commands[1][0] == "speedladder race --preset d2l-512 --rungs bf16,cudagraphs,muon"


def test_the_complete_h200_gpt2_run_credits_each_rung_its_own_gain_and_never_says_it_learns():
    res = h200("second-gpt2")
    lc = res.learns_check
    assert lc is not None and lc.skipped and not lc.passed  # saved as passed: a skipped check is read as not passed
    c = conclusion.of(res, "RUN_DIR")
    assert c is not None and c.best == "fused-adamw"
    assert c.headline == ("the fastest configuration is fused-adamw (eager + sdpa + fused-adamw): 1.22× eager in "
                          "tokens/s, every gate passed; learns: not checked.")
    assert c.paid == ["sdpa 1.21× eager", "fused-adamw 1.01× sdpa"]  # its own 1.01×, not the chain's 1.22×
    assert c.not_paid == ["pad-vocab: 0.98× fused-adamw, loss"] and c.learns == "not checked: --learns-steps 0"
    # The ladder full's rungs it ran are not among those "this run did not try".
    assert not any("sdpa" in cmd for cmd, _ in c.commands if "--ladder full" in cmd)
    assert all("sdpa" not in line for line in c.change)


def test_speedladder_report_prints_the_h200_conclusions_in_100_columns(tmp_path):
    """`speedladder report` on the saved files, as a user runs it: the conclusion agrees with the table above it."""
    for name in ("small", "cuda", "second-gpt2"):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(H200 / f"{name}.json", folder / storage.FILENAME)
        out = Console(file=io.StringIO(), width=100)
        print_report(storage.load(folder), out, folder=str(folder))
        text = out.file.getvalue()  # type: ignore[attr-defined]
        tail = text[text.index("conclusion: "):]
        assert "did not pay: cudagraphs" not in tail and "nothing here to train" not in tail
        assert "it learns" not in tail and "learns: not checked" in tail
        head = text.splitlines()[:3]  # the title, the trust line, and where an interrupted run stopped
        assert head[1].startswith("trust: ") and head[2].startswith("interrupted: stopped during ") == (
            name != "second-gpt2")


# -- the learns-check's record, as the ladder writes it ----------------------------------------------------------

def test_learns_steps_0_records_a_check_not_passed_and_the_run_never_says_it_learns(tmp_path, capsys):
    """`speedladder run --preset tiny --rungs eager,batch --learns-steps 0`, as the issue ran it on a CPU."""
    assert main(["run", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,batch", "--learns-steps", "0",
                 "--window-steps", "2", "--loss-steps", "2", "--no-profile", "--no-process-peak",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (folder,) = tmp_path.iterdir()
    saved = json.loads((folder / storage.FILENAME).read_text())
    assert saved["learns_check"]["skipped"] and saved["learns_check"]["passed"] is False
    assert saved["learns_check"]["rung"] == saved["fastest"]
    assert "it learns" not in out and "learns: not checked: --learns-steps 0." in out
    trust = next(line for line in out.splitlines() if line.startswith("trust: "))
    assert "learns-check: not checked (--learns-steps 0)" in trust


def test_a_run_stopped_before_the_learns_check_records_it_not_run(tmp_path, monkeypatch, capsys):
    interrupt_at_window(monkeypatch, 7)  # eager's 5 windows, then the 2nd of bf16's (interleaved with eager's)
    assert main(["run", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,bf16,batch", "--window-steps", "2",
                 "--loss-steps", "2", "--no-profile", "--no-process-peak", "--out", str(tmp_path)]) == 130
    out = capsys.readouterr().out
    (folder,) = tmp_path.iterdir()
    saved = storage.load(folder)
    lc = saved.learns_check
    assert saved.status == "interrupted" and saved.fastest is None
    assert lc is not None and lc.skipped and not lc.passed and lc.detail == "the run stopped before the learns-check"
    assert "interrupted: stopped during bf16 (stopped by Ctrl-C during this rung); not reached: batch; the " \
           "learns-check did not run. Best so far: eager, 1.00× eager, every gate passed." in out
    assert f"--config {folder}/config.toml --rungs eager,bf16,batch" in out
