"""The kinks a probe could not avoid, priced (docs/measurement.md, rule 12; the `flip_pricing` refinement).

Where no sequence of the gate batches is clear of a kink (a big ReLU model has ReLU inputs within rounding of zero
in every sequence), the probe stays, and a rung that only re-rounds may flip some of the remaining elements. At an
op whose value is continuous at its kink (relu, threshold, hardtanh, leaky_relu) a flip moves the backward alone:
the input's gradient at that element changes by the slope's change times the gradient arriving. So the float64
backward runs again with every remaining element flipped, each with a random sign, by a dispatch mode on the op's
mask (threshold_backward and its kin): E||sum s_i d_i||^2 = sum ||d_i||^2, so a few draws estimate the root-sum-
square of what each flip moves a gradient by, which bounds what the largest one does, and each gradient's
allowance grows by FLIP_K times it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from speedladder.step.train_step import TrainStep
from speedladder.verify.kink_census import FLIPPABLE, Batch, Count, distances
from speedladder.verify.probes import host_copy

aten = torch.ops.aten

# The backward ops that apply a flippable kink's mask (kink_census.FLIPPABLE): a flip there changes the input's gradient
# at that element by (slope change) x the gradient arriving, and nothing in the forward.
_MASKS = {aten.threshold_backward, aten.hardtanh_backward, aten.leaky_relu_backward}
# Random-sign flips of every remaining element at once: E||sum s_i d_i||^2 = sum ||d_i||^2, the square of what one
# flip of the largest could move a gradient by, and of what a random part of them flipping moves it by on average.
FLIP_DRAWS = 4
# The allowance is this many times that root-sum-square (an estimate from FLIP_DRAWS draws, and a subset of flips
# may land on one side).
FLIP_K = 2.0


class _Flips(TorchDispatchMode):
    """Forward: the storage of each flippable kink op's input and output, with its remaining near elements.
    Backward: the op's input gradient plus a random sign times the slope's change times the arriving gradient at
    those elements: every remaining element flipped, each one way or the other."""

    def __init__(self, near: dict[int, torch.Tensor], generator: torch.Generator) -> None:
        super().__init__()
        self.near, self.generator = near, generator
        self.place = 0
        self.saved: dict[int, torch.Tensor] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        op = func.overloadpacket
        if op in _MASKS:
            out = func(*args, **kwargs)
            idx = self.saved.get(args[1].data_ptr())
            if idx is None:
                return out
            slope = 1.0 - float(args[2]) if op is aten.leaky_relu_backward else 1.0
            signs = torch.randint(0, 2, (idx.numel(),), generator=self.generator).to(out) * 2 - 1
            idx = idx.to(out.device)
            delta = torch.zeros(out.numel(), dtype=out.dtype, device=out.device)
            delta[idx] = signs * slope * args[0].reshape(-1)[idx]
            return out + delta.view_as(out)
        with torch.no_grad():
            kink = distances(func, args, kwargs) is not None
        out = func(*args, **kwargs)
        if kink:
            idx = self.near.get(self.place)
            if idx is not None and op.__name__ in FLIPPABLE:
                for t in (args[0], out):
                    if isinstance(t, torch.Tensor):
                        self.saved[t.data_ptr()] = idx
            self.place += 1
        return out


def _gradients(step: TrainStep, weights: dict[str, torch.Tensor], batch: Batch,
               flips: _Flips | None) -> dict[str, torch.Tensor]:
    """The float64 step's gradients at the weights on the batch (with the flips, when given), on the host."""
    step.reset(weights)
    x, y = (t.to(step.device) for t in batch)
    if flips is None:
        step.forward_backward(x, y)
    else:
        with flips:
            step.forward_backward(x, y)
    return host_copy({n: step.reference_part(n, p.grad) for n, p in step.params.items() if p.grad is not None},
                     torch.float64)


def flip_allowance(step64: TrainStep, weights: dict[str, torch.Tensor], batch: Batch, remaining: Count,
                   seed: int = 0) -> dict[str, float]:
    """Per parameter, what flipping the remaining near elements could move its gradient by, in float64 (the
    norm, absolute): FLIP_K x the root-sum-square of each element's effect, estimated from FLIP_DRAWS random-sign
    flips of them all. Empty when none remain at an op whose flip can be priced."""
    if not remaining.flippable:
        return {}
    normal = _gradients(step64, weights, batch, None)
    generator = torch.Generator().manual_seed(seed)
    squares = dict.fromkeys(normal, 0.0)
    for _ in range(FLIP_DRAWS):
        moved = _gradients(step64, weights, batch, _Flips(remaining.flippable, generator))
        for n, g in normal.items():
            squares[n] += float((moved[n] - g).pow(2).sum())
    return {n: FLIP_K * math.sqrt(v / FLIP_DRAWS) for n, v in squares.items()}
