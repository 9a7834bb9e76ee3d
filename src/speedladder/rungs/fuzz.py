"""A rounding fuzz: the processor nobody tuned for, on every machine (docs/measurement.md, rule 12).

A rung that only re-rounds must pass every gate: a compiled kernel, another vector ISA, a GPU we have never seen
or a user's rung that reorders a sum computes the same function with other roundings. This transform makes such a
rung on any machine: every module's output in the forward, every gradient it passes back and every parameter's
gradient is multiplied by (1 + u), u drawn uniformly within +-(scale x the unit roundoff of the tensor's own
format) (fp32 2^-24, bf16 2^-8, fp16 2^-11: under bf16 autocast a matmul's output is bf16 and is fuzzed at bf16's),
afresh for each module call and each gradient. Uniform within one unit roundoff is what rounding to nearest does to
a value: one more rounding of every module's output and gradient, at scale 1.

Like a kernel on a processor, it is deterministic: the generator is seeded again at each call of the whole model,
so the same batch at the same weights gives the same result twice, and a position's rounding does not depend on
the tokens after it (a fuzz that drew new noise on every run would be a nondeterministic rung, and the causality
probe could not tell its noise from a leak). Declared as a speed rung, it is the clean control every gate must pass
(docs/examples/rounding_fuzz.py, tests/test_kinks.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, MutableMapping
from typing import Any

import torch
from torch import nn

from speedladder.rungs.api import RungError

UNIT_ROUNDOFF = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11,
                 torch.bfloat16: 2.0 ** -8}


class _Draws:
    """One seeded generator per device, seeded again at each call of the whole model."""

    def __init__(self, seed: int, scale: float) -> None:
        self.seed, self.scale = seed, scale
        self.generators: dict[torch.device, torch.Generator] = {}

    def reset(self) -> None:
        for g in self.generators.values():
            g.manual_seed(self.seed)

    def rerounded(self, t: torch.Tensor) -> torch.Tensor:
        """t x (1 + u), u uniform within +-scale x the unit roundoff, elementwise, in t's format."""
        g = self.generators.get(t.device)
        if g is None:
            g = self.generators[t.device] = torch.Generator(t.device).manual_seed(self.seed)
        u = self.scale * UNIT_ROUNDOFF.get(t.dtype, 0.0)
        noise = torch.rand(t.shape, generator=g, device=t.device, dtype=torch.float32).double() * 2 - 1
        # In float64, then rounded back to t's format: the nearest value to t(1 + u) there, as a kernel that
        # computed the same value another way would round it (t itself, or a neighbour).
        return (t.double() * (1 + u * noise)).to(t.dtype)


class _Fuzzed(torch.autograd.Function):
    """The forward value re-rounded, and the gradient flowing back through it re-rounded afresh."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, draws: _Draws) -> torch.Tensor:
        ctx.draws = draws
        return draws.rerounded(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.draws.rerounded(g), None


def _fuzz(out: Any, draws: _Draws) -> Any:
    if isinstance(out, torch.Tensor):
        if not out.is_floating_point():
            return out
        return _Fuzzed.apply(out, draws) if out.requires_grad else draws.rerounded(out)
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
        return tuple(_fuzz(o, draws) for o in out)
    if isinstance(out, list):
        return [_fuzz(o, draws) for o in out]
    if isinstance(out, MutableMapping):  # a Hugging Face ModelOutput: its fields re-rounded in place
        for k in list(out.keys()):
            out[k] = _fuzz(out[k], draws)
        return out
    return out


def rounding_fuzz(scale: float = 1.0, seed: int = 0) -> Callable[[nn.Module], nn.Module]:
    """A model transform that only re-rounds (the module's docstring): `scale` times each format's unit roundoff,
    drawn from a generator seeded with `seed`. The model keeps its parameters; hooks do the rest."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise RungError(f"rounding fuzz: the magnitude must be a positive number (times the unit roundoff), "
                        f"got {scale!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise RungError(f"rounding fuzz: the seed must be a whole number, got {seed!r}")

    def transform(model: nn.Module) -> nn.Module:
        draws = _Draws(seed, float(scale))
        model.register_forward_pre_hook(lambda _m, _args: draws.reset())
        for module in model.modules():
            module.register_forward_hook(lambda _m, _args, out: _fuzz(out, draws))
        for p in model.parameters():
            if p.requires_grad:
                p.register_hook(draws.rerounded)
        return model
    return transform
