"""One Tolerance per precision (verify/tolerance.py) and the judge that reads it (verify/distance.py): the allowance
is k x the scale + the floor, a loss curve's curve_k x at least eager fp32 re-rounded, and where eager fp32 stands
in for the truth its own error is allowed for, as the verdict says (docs/measurement.md, rule 12)."""

from __future__ import annotations

import pytest

from speedladder.verify.distance import Errors, judge
from speedladder.verify.tolerance import EAGER_AS_TRUTH, TOLERANCES, Refinements

FP32 = TOLERANCES["fp32"]


def test_one_tolerance_per_precision_its_floors_growing_as_the_mantissa_shrinks():
    t = TOLERANCES
    assert set(t) == {"fp32", "tf32", "fp16", "bf16", "fp8"}
    assert t["fp32"].floor < t["tf32"].floor <= t["fp16"].floor < t["bf16"].floor < t["fp8"].floor
    assert t["fp32"].causal_floor < t["tf32"].causal_floor <= t["bf16"].causal_floor
    assert t["fp8"].causal_floor == t["bf16"].causal_floor  # rowwise scales see no future: bf16's floor
    assert all(tol.k == 3.0 and tol.curve_k == 10.0 for tol in t.values())


def test_every_refinement_is_on_by_default_and_each_has_a_switch():
    assert Refinements() == Refinements(kink_census=True, flip_pricing=True, emulated_precision=True, bisection=True)


def _errors(v: float, curve: float | None = None) -> Errors:
    return Errors(logits=v, loss=v, grads={"w": v}, curve=curve)


def test_the_allowance_is_k_times_the_larger_scale_plus_the_floor():
    eager, base = _errors(1e-6, 1e-6), _errors(2e-6, 3e-6)
    judged = judge(_errors(5e-6, 2e-5), ("eager fp32", eager), ("sdpa", base), "fp32", FP32)
    assert judged.passed and judged.truth == "fp64" and judged.scale == "eager fp32 and sdpa (the rung it built on)"
    assert judged.grad.allowed == pytest.approx(3 * 2e-6 + 1e-5)
    assert judged.curve.allowed == pytest.approx(10 * 3e-6 + 1e-5)
    wrong = judge(_errors(5e-5), ("eager fp32", eager), None, "fp32", FP32)
    assert not wrong.passed and "from fp64" in wrong.detail


def test_the_curves_scale_is_at_least_eager_re_rounded():
    """A loss curve is chaotic: its scale is at least the spread of eager fp32 re-rounded (`spread` recorded), which
    can only widen what is allowed."""
    e = Errors(logits=0.0, loss=0.0, grads={}, curve=0.0)
    tiny_eager = Errors(logits=1e-9, loss=1e-9, grads={}, curve=1e-12)
    judged = judge(e, ("eager", tiny_eager), None, "fp32", FP32, curve_spread=2e-6)
    assert judged.curve is not None and judged.curve.spread == 2e-6
    assert judged.curve.allowed == pytest.approx(FP32.curve_k * 2e-6 + FP32.floor)
    without = judge(e, ("eager", tiny_eager), None, "fp32", FP32)
    assert without.curve is not None and without.curve.allowed < judged.curve.allowed


def test_without_fp64_the_same_rule_allows_for_eager_fp32s_own_error_and_says_so():
    """Eager fp32 standing in for the truth is 0 from itself: the allowance grows by what its own error may be, one
    floor per quantity, and the verdict's status and its line say what the distances are from."""
    zero = _errors(0.0, 0.0)
    within = Errors(logits=5e-5, loss=5e-6, grads={"w": 5e-4}, curve=5e-5)  # each inside its own quantity's
    judged = judge(within, ("eager fp32", zero), None, "fp32", FP32, fp64=False)
    assert judged.truth == "eager fp32" and judged.passed
    assert judged.grad.allowed == pytest.approx(FP32.floor + EAGER_AS_TRUTH.grad)
    assert judged.logits.allowed == pytest.approx(FP32.floor + EAGER_AS_TRUTH.logits)
    assert judged.loss.allowed == pytest.approx(FP32.floor + EAGER_AS_TRUTH.loss)
    wrong = judge(_errors(5e-3, 5e-3), ("eager fp32", zero), None, "fp32", FP32, fp64=False)
    assert not wrong.passed and "from eager fp32" in wrong.detail


def test_no_scale_at_a_precision_leaves_the_floor_alone_and_says_so():
    judged = judge(_errors(5e-3), None, None, "bf16", TOLERANCES["bf16"])
    assert not judged.passed and judged.grad.eager is None and "floor alone" in judged.scale
