"""Distances from the truth (verify/distance.py): each relative to the truth's norm, a vanishing gradient to the
norm the model's mean gradient gives a tensor its size, a missing or non-finite one never within what is allowed."""

from __future__ import annotations

import math

import pytest
import torch

from speedladder.verify.distance import Truth, curve_error, errors


def _outputs(grads: dict[str, torch.Tensor], loss: float = 2.0):
    return torch.ones(1, 2, 3, dtype=torch.float64), loss, grads


def test_a_vanishing_gradient_is_measured_against_the_models_mean_gradient_not_its_own_zero():
    truth = _outputs({"w": torch.full((100,), 1.0, dtype=torch.float64),
                      "key.bias": torch.zeros(4, dtype=torch.float64)})
    noise = _outputs({"w": torch.full((100,), 1.0), "key.bias": torch.full((4,), 1e-7)})
    e = errors(noise, truth)
    rms = Truth.grad_rms(truth)
    assert e.grads["w"] == 0.0
    # 1e-7 of rounding noise on a zero gradient: relative to the model's mean gradient, not infinitely far.
    assert e.grads["key.bias"] == pytest.approx(1e-7 * 2 / (rms * 2), rel=1e-6)


def test_a_missing_gradient_or_a_non_finite_curve_is_infinitely_far():
    truth = _outputs({"w": torch.ones(3, dtype=torch.float64)})
    assert errors(_outputs({}), truth).grads["w"] == math.inf
    assert curve_error([1.0, math.nan], [1.0, 1.0]) == math.inf
    assert curve_error([1.1, 1.0], [1.0, 1.0]) == pytest.approx(0.1)
