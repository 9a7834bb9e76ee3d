"""Verdicts that hold (docs/measurement.md, rule 8), on synthetic windows: no timing in these tests."""

from __future__ import annotations

import math
import random

import pytest

from speedladder.measure import judging
from speedladder.measure.timer import Timing, Window
from speedladder.records import Gate, RungResult
from speedladder.spec import StepSpec

RATE = 100_000.0  # tokens/s of both sides: the rung changes nothing
NOISE = 0.01  # each window's own scatter (1% standard deviation)
DRIFT = 0.05  # the machine's speed moves by +-5% over the comparison


def window(rate: float, recompiles: int = 0) -> Window:
    return Window(seconds=1000 / rate, steps=10, tokens=1000, recompiles=recompiles)


def timing(rates: list[float]) -> Timing:
    return Timing(0.0, [], [], [window(r) for r in rates])


def machine(rng: random.Random, n: int):
    """A speed factor for slot i of n: a drift from -5% to +5% (its direction drawn), times window noise."""
    sign = rng.choice((-1, 1))
    return lambda i: (1 + sign * DRIFT * (2 * i / (n - 1) - 1)) * (1 + rng.gauss(0, NOISE))


def interleaved(seed: int, windows: int = 5) -> tuple[Timing, Timing]:
    """Rung and base windows in the order timer.interleave runs them: A B, B A, A B, ..."""
    rng = random.Random(seed)
    speed = machine(rng, 2 * windows)
    rung, base, slot = [], [], 0
    for i in range(windows):
        for side in ((rung, base) if i % 2 == 0 else (base, rung)):
            side.append(RATE * speed(slot))
            slot += 1
    return timing(rung), timing(base)


def one_after_the_other(seed: int, windows: int = 3) -> tuple[Timing, Timing]:
    """The old way: the base's windows first, the rung's minutes later, the drift between them."""
    rng = random.Random(seed)
    speed = machine(rng, 2 * windows)
    base = [RATE * speed(i) for i in range(windows)]
    rung = [RATE * speed(windows + i) for i in range(windows)]
    return timing(rung), timing(base)


def verdicts(make, trials: int = 20) -> list[str]:
    return [judging.judge(*make(seed))[0] for seed in range(trials)]


def test_a_no_op_rung_is_noise_at_least_19_times_in_20_under_drift():
    found = verdicts(interleaved)
    assert sum(v in ("win", "loss") for v in found) <= 1, found


def test_the_old_rule_is_fooled_by_the_same_drift():
    """The check above can fail: three windows each, timed one after the other, call drift a win or a loss."""
    found = verdicts(one_after_the_other)
    assert sum(v in ("win", "loss") for v in found) >= 10, found


def test_the_written_false_verdict_rate_for_five_windows():
    # No change and exchangeable windows: all 5 rung windows above all 5 base windows with probability 1/C(10,5).
    assert 2 / math.comb(10, 5) == pytest.approx(0.0079, abs=1e-4)
    rng = random.Random(0)
    false = 0
    trials = 20_000
    for _ in range(trials):
        rung = timing([rng.gauss(RATE, RATE * NOISE) for _ in range(5)])
        base = timing([rng.gauss(RATE, RATE * NOISE) for _ in range(5)])
        false += judging.judge(rung, base)[0] in ("win", "loss")
    assert false / trials == pytest.approx(2 / math.comb(10, 5), abs=0.003)


def test_a_real_gain_is_still_a_win_under_the_same_drift():
    wins = 0
    for seed in range(20):
        rung, base = interleaved(seed)
        faster = timing([w.tokens_per_s * 1.25 for w in rung.windows])  # the rung 25% faster
        wins += judging.judge(faster, base)[0] == "win"
    assert wins == 20


def test_fewer_than_three_clean_windows_is_inconclusive():
    rung = Timing(0.0, [], [], [window(2e5), window(2e5, recompiles=1), window(2e5, recompiles=2)])
    base = timing([1e5, 1e5, 1e5])
    verdict, why = judging.judge(rung, base)
    assert verdict == "inconclusive" and "the rung has 1" in why
    assert judging.judge(timing([2e5] * 3), base) == ("win", "")


def test_what_to_build_on_follows_the_best_estimate():
    """Two questions, two rules (docs/measurement.md, rule 13): a win builds; noise builds only above 1.0x; a loss, a
    ratio at or below 1.0x, or a verdict its test went against never does."""
    from speedladder.measure.judging import SLOWER, builds_on, why_not_built

    assert builds_on("win", 1.3) and builds_on("noise", 1.01) and builds_on("inconclusive", 1.2)
    assert not builds_on("noise", 0.99) and not builds_on("noise", 1.0) and not builds_on("noise", None)
    assert not builds_on("loss", 0.7) and not builds_on("not a win", 1.4) and not builds_on("did not reach", 1.1)
    assert why_not_built("loss") == why_not_built("noise") == why_not_built("did not reach") == SLOWER == "slower"
    assert why_not_built("not a win") == "worse at equal tokens"


def _passed(name: str, kind: str, verdict: str, prev: float) -> RungResult:
    r = RungResult(name=name, rung=name, role="rung", reason="", kind=kind, built_on="cudagraphs", spec=StepSpec(64, 128),
                   precision="bf16", requirement={}, status="ok", verdict=verdict, speedup_prev=prev,
                   gate=Gate(passed=True))
    return r


@pytest.mark.parametrize("verdict, prev", [("loss", 0.29), ("noise", 1.02), ("win", 1.4)])
def test_a_rung_that_trades_tokens_per_s_for_tokens_to_a_loss_is_left_to_the_race(verdict, prev):
    """An optimizer or architecture rung (Muon: 0.29x cudagraphs in tokens/s on the H200 of 2026-12-04, 5.56x fewer
    tokens to AdamW's loss) is never a base for speed, whatever its tokens/s; its reason says the race judges it. A
    speed rung and a memory rung follow their own rules."""
    from speedladder.ladder import builds_on

    for kind in ("optimizer", "architecture"):
        r = _passed("muon", kind, verdict, prev)
        assert builds_on.judged_by_race(r) and not builds_on.pays(r)
        why = builds_on.not_built_upon(r, "cudagraphs")
        assert why.startswith(f"race: an {kind} rung, judged by time to a target loss, not by tokens/s ({prev:.2f}x")
        assert why.endswith("the race judges it, and the rungs above build on cudagraphs")
        r.not_built_upon = why
        assert builds_on.word(r) == "race"
    assert builds_on.pays(_passed("ckpt", "memory", "loss", 0.8))  # a memory rung is expected to cost speed
    assert builds_on.pays(_passed("sdpa", "speed", verdict, prev)) == (prev > 1.0)


def test_the_fastest_is_ranked_among_what_the_climb_built_on():
    """The learns-check's order and an interrupted run's best so far: by x cum, never a rung left out of the climb
    (slower, or judged by the race), never a control or a rung that failed a gate."""
    from speedladder.ladder import builds_on
    from speedladder.records import Results

    def rec(name, cum, **kw):
        r = _passed(name, kw.pop("kind", "speed"), "win", cum)
        r.speedup_cum = cum
        for k, v in kw.items():
            setattr(r, k, v)
        return r

    rungs = [rec("eager", 1.0), rec("cudagraphs", 3.46), rec("muon", 5.0, kind="optimizer", not_built_upon="race: x"),
             rec("wrong", 9.0, gate=Gate(passed=False)), rec("batch-fp32", 8.0, role="control"), rec("fp8", 0.22)]
    res = Results(schema="", created="", command=[], config=None, environment=None, model=None,  # type: ignore[arg-type]
                  rungs=rungs)
    assert [r.name for r in builds_on.ranked(res)] == ["cudagraphs", "eager", "fp8"]
