"""A rounding fuzz: the processor nobody tuned for, on every machine (docs/measurement.md, rule 12).

A rung that only re-rounds must pass every gate: a compiled kernel, another vector ISA, a GPU we have never seen
or a user's rung that reorders a sum computes the same function with other roundings. This transform makes such a
rung on any machine: every module's output in the forward, every gradient it passes back and every parameter's
gradient is multiplied by (1 + u), u drawn uniformly within +-(scale x the unit roundoff of the tensor's own
format) (fp32 2^-24, bf16 2^-8, fp16 2^-11: under bf16 autocast a matmul's output is bf16 and is fuzzed at bf16's),
afresh for each module call and each gradient (read in order from a table of draws seeded once). Uniform within one
unit roundoff is what rounding to nearest does to a value: one more rounding of every module's output and
gradient, at scale 1.

Like a kernel on a processor, it is deterministic: the table is read from its start again at each call of the
whole model, so the same batch at the same weights gives the same result twice, and a position's rounding does not
depend on the tokens after it (a fuzz that drew new noise on every run would be a nondeterministic rung, and the
causality probe could not tell its noise from a leak). Declared as a speed rung, it is the clean control every gate
must pass (docs/examples/rounding_fuzz.py, tests/verify/test_reference.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, MutableMapping
from typing import Any

import torch
from torch import nn

from speedladder.rungs.registry import RungError

UNIT_ROUNDOFF = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11,
                 torch.bfloat16: 2.0 ** -8}


# The noise is drawn once per seed, device and format (TABLE values, 16 MB in fp32) and read in order, call after
# call, from where the last call stopped: one fused multiply-add per tensor instead of a fresh draw (measured on one
# CPU thread, 524k elements: 0.35 ms against 8.5 ms), so a fuzzed step costs about one more pass over each output.
TABLE = 1 << 22


class _Draws:
    """One table of uniform draws per device and format, read from its start again at each call of the whole
    model: a tensor's draws depend on the shapes fuzzed before it in that call, never on its values."""

    def __init__(self, seed: int, scale: float) -> None:
        self.seed, self.scale = seed, scale
        self.tables: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        self.at = 0

    def reset(self) -> None:
        self.at = 0

    def _table(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """u uniform within +-scale x the format's unit roundoff (in fp32; fp64's in fp64)."""
        key = (device, dtype)
        if key not in self.tables:
            g = torch.Generator(device).manual_seed(self.seed)
            wide = torch.float64 if dtype == torch.float64 else torch.float32
            uniform = torch.rand(TABLE, generator=g, device=device, dtype=torch.float32).to(wide) * 2 - 1
            self.tables[key] = uniform * (self.scale * UNIT_ROUNDOFF.get(dtype, 0.0))
        return self.tables[key]

    def _noise(self, n: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The next n draws of the table, wrapping round its end."""
        table = self._table(device, dtype)
        start = self.at % TABLE
        self.at += n
        if start + n <= TABLE:
            return table[start:start + n]
        pieces, left = [table[start:]], n - (TABLE - start)
        while left > 0:
            pieces.append(table[:min(left, TABLE)])
            left -= TABLE
        return torch.cat(pieces)

    def rerounded(self, t: torch.Tensor) -> torch.Tensor:
        """t x (1 + u), u uniform within +-scale x the unit roundoff, elementwise, rounded to t's format: the
        nearest value to t(1 + u) there, as a kernel that computed the same value another way would round it."""
        if t.numel() == 0:
            return t
        noise = self._noise(t.numel(), t.device, t.dtype).view(t.shape)
        if t.dtype in (torch.float32, torch.float64):
            return torch.addcmul(t, t, noise)
        wide = t.float()
        return torch.addcmul(wide, wide, noise).to(t.dtype)


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


def attach(model: nn.Module, scale: float = 1.0, seed: int = 0) -> Callable[[], None]:
    """The rounding fuzz on a model as hooks (the module's docstring), and the call that takes them off again: the
    gates re-round eager fp32 in place this way, with no second model."""
    draws = _Draws(seed, float(scale))
    handles = [model.register_forward_pre_hook(lambda _m, _args: draws.reset())]
    handles += [module.register_forward_hook(lambda _m, _args, out: _fuzz(out, draws)) for module in model.modules()]
    handles += [p.register_hook(draws.rerounded) for p in model.parameters() if p.requires_grad]

    def remove() -> None:
        for h in handles:
            h.remove()
    return remove


def rounding_fuzz(scale: float = 1.0, seed: int = 0) -> Callable[[nn.Module], nn.Module]:
    """A model transform that only re-rounds (the module's docstring): `scale` times each format's unit roundoff,
    drawn from a table seeded with `seed`. The model keeps its parameters; hooks do the rest."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise RungError(f"rounding fuzz: the magnitude must be a positive number (times the unit roundoff), "
                        f"got {scale!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise RungError(f"rounding fuzz: the seed must be a whole number, got {seed!r}")

    def transform(model: nn.Module) -> nn.Module:
        attach(model, float(scale), seed)
        return model
    return transform
