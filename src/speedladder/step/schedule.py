"""The recipe made real (config/recipe.py holds its values): AdamW's parameter groups, the learning-rate schedule
and its scheduler. speedladder's own step (step.TrainStep) and `speedladder.apply` use these same pieces, so a
plain nanoGPT-style loop given them trains what `train` trains.

The schedule is nanoGPT's get_lr (train.py) with the learning rate as 1: a linear warm-up of W updates from
1/(W+1), then constant, or cosine or linear decay from 1 to the floor at update L, the floor after it. W and L
count updates of the configuration trained ("steps") or tokens, converted by the tokens one update trains.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from speedladder.config.recipe import RecipeConfig
from speedladder.errors import UsageError


@dataclass(frozen=True)
class Span:
    """A count of updates ("steps": of the configuration trained) or of tokens."""

    value: float
    unit: str  # "steps" or "tokens"

    def updates(self, tokens_per_update: int) -> float:
        return self.value if self.unit == "steps" else self.value / tokens_per_update

    def __str__(self) -> str:
        return f"{self.value:,.0f} {self.unit}"


@dataclass(frozen=True)
class Schedule:
    """The learning rate's factor at each update (the module's docstring)."""

    kind: str = "constant"  # constant, cosine or linear (config.recipe.SCHEDULES)
    warmup: Span = Span(0, "steps")
    length: Span | None = None  # where the decay reaches the floor; None: a constant rate needs none
    floor: float = 0.1

    @property
    def moves(self) -> bool:
        """Whether the rate ever differs from the base rate: else nothing sets it."""
        return self.kind != "constant" or self.warmup.value > 0

    def factor(self, update: int, tokens_per_update: int) -> float:
        """The factor of the base learning rate for update `update` (0 first)."""
        w = self.warmup.updates(tokens_per_update)
        if update < w:
            return (update + 1) / (w + 1)
        if self.kind == "constant" or self.length is None:
            return 1.0
        end = self.length.updates(tokens_per_update)
        if update > end or end <= w:
            return self.floor
        r = (update - w) / (end - w)
        shape = 0.5 * (1.0 + math.cos(math.pi * r)) if self.kind == "cosine" else 1.0 - r
        return self.floor + shape * (1.0 - self.floor)

    def describe(self) -> str:
        warm = f"warm-up {self.warmup}, then " if self.warmup.value else ""
        if self.kind == "constant":
            return f"{warm}constant"
        return f"{warm}{self.kind} decay to {self.floor:g}x at {self.length}"


def schedule_of(recipe: RecipeConfig, horizon: Span, base_tokens: int, tokens_only: bool = False) -> Schedule:
    """The recipe's schedule, its length the recipe's own or else the command's training (`horizon`); a warm-up as
    long as the schedule or longer is a usage error. tokens_only (a race): every count in tokens, the recipe's
    steps being steps of the workload's batch (`base_tokens` each), as every count of a race is."""
    length = Span(recipe.length, recipe.unit) if recipe.length is not None else horizon
    if tokens_only and length.unit == "steps":
        length = Span(length.value * base_tokens, "tokens")
    warmup = (Span(recipe.warmup, recipe.unit) if recipe.warmup else
              Span(math.floor(recipe.warmup_share * length.value), length.unit))
    if tokens_only and warmup.unit == "steps":
        warmup = Span(warmup.value * base_tokens, "tokens")
    if warmup.value and warmup.updates(base_tokens) >= length.updates(base_tokens):
        raise UsageError(f"a warm-up of {warmup} is not shorter than the schedule's {length} "
                         "(--lr-warmup, --schedule-length, or the command's training)")
    return Schedule(recipe.schedule, warmup, length if recipe.schedule != "constant" else None, recipe.floor)


def param_groups(named: dict[str, nn.Parameter] | Iterable[tuple[str, nn.Parameter]],
                 recipe: RecipeConfig) -> list[nn.Parameter] | list[dict[str, Any]]:
    """What AdamW is given: every parameter (decay "all", at the optimizer's own weight decay), or nanoGPT's split
    (decay "2d", configure_optimizers in its model.py): the parameters with two or more dimensions (matrices,
    embeddings) at the optimizer's weight decay, the rest (biases, norms) in a group of their own at none."""
    params: list[nn.Parameter] = [p for _, p in (named.items() if isinstance(named, dict) else named)]
    if recipe.decay == "all":
        return params
    groups: list[dict[str, Any]] = [{"params": [p for p in params if p.dim() >= 2]},
                                    {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return groups


def optimizers_in(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside one (Muon and AdamW in the muon rung's pair): what a schedule or a gradient
    scaler acts on; none for a rung's own optimizer without param_groups."""
    inner = [getattr(optimizer, a) for a in ("muon", "adamw") if hasattr(optimizer, a)]
    found = inner or [optimizer]
    return [o for o in found if isinstance(o, torch.optim.Optimizer)]


class RecipeLR:
    """The schedule on an optimizer (or the muon rung's pair): each parameter group's rate is its initial rate times
    the schedule's factor. Made before the first update (it sets update 0's rate); `step()` after each update, as
    torch's schedulers are called."""

    def __init__(self, optimizer: Any, schedule: Schedule, tokens_per_update: int, last: int = 0) -> None:
        self.schedule, self.tokens_per_update = schedule, tokens_per_update
        self.groups = [g for o in optimizers_in(optimizer) for g in o.param_groups]
        for g in self.groups:
            g.setdefault("initial_lr", g["lr"])
        self.update = last
        self._set()

    def _set(self) -> None:
        f = self.schedule.factor(self.update, self.tokens_per_update)
        for g in self.groups:
            g["lr"] = g["initial_lr"] * f

    def step(self) -> None:
        self.update += 1
        self._set()

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.groups]

    def state_dict(self) -> dict[str, int]:
        return {"update": self.update}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.update = state["update"]
        self._set()


def race_length(recipe: RecipeConfig, budget_steps: int | None, calibrate_steps: int,
                base_tokens: int) -> tuple[int | None, int, Span]:
    """A race's token budget (in base steps; 0: its criterion off), its calibration's steps and its schedule's
    length: a schedule's length is the race's budget, as in modded-nanogpt, and the target is eager fp32's val loss
    at its end. A recipe whose rate never moves leaves the race as it was. The schedule's own length, when given,
    sets the budget; given beside a budget of another length, it is a usage error."""
    if not recipe.scheduled:
        budget = calibrate_steps if budget_steps is None else budget_steps
        return budget_steps, calibrate_steps, Span(budget * base_tokens, "tokens")
    if recipe.length is not None:
        tokens = recipe.length * (base_tokens if recipe.unit == "steps" else 1)
        steps = math.ceil(tokens / base_tokens)
        if budget_steps and budget_steps != steps:
            raise UsageError(f"a schedule's length is the race's budget: --schedule-length is {steps:,} base steps' "
                             f"worth, --budget-steps {budget_steps:,}; give one of them")
    else:
        steps = budget_steps or calibrate_steps
        tokens = steps * base_tokens
    return (0 if budget_steps == 0 else steps), steps, Span(tokens, "tokens")
