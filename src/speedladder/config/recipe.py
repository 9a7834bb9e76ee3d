"""The training recipe: AdamW's settings, which parameters decay, gradient clipping, the learning-rate schedule and
gradient accumulation. One typed section of the run (`[run.recipe]` in config.toml, the `recipe` flags), used by
every command that trains a step and by the gates' references alike (docs/usage.md#the-recipe).

The field defaults are today's behaviour and the one source of it: torch's AdamW (weight decay 0.01 on every
parameter, betas (0.9, 0.999), eps 1e-8) at a constant learning rate, no clipping. `--recipe NAME` names a set of
values (RECIPES); a field given beside it, on the command line or in a file, wins over the named value.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from speedladder import codec
from speedladder.codec import Group, Unknown, option
from speedladder.errors import UsageError

SCHEDULES: tuple[str, ...] = ("constant", "cosine", "linear")
DECAY: tuple[str, ...] = ("all", "2d")  # which parameters AdamW decays: every one, or nanoGPT's 2-D ones only
UNITS: tuple[str, ...] = ("steps", "tokens")

# nanoGPT's train.py (github.com/karpathy/nanoGPT, train.py, its defaults for GPT-2 124M on OpenWebText):
# weight_decay = 1e-1, applied by configure_optimizers (model.py) to the parameters with dim >= 2 only; beta1 = 0.9,
# beta2 = 0.95; grad_clip = 1.0; decay_lr = True: a linear warm-up of warmup_iters = 2000, then cosine decay to
# min_lr = 6e-5 (learning_rate / 10) at lr_decay_iters = 600000 = max_iters. The warm-up is kept as its share of
# the schedule (2000 of 600000), since a schedule here is as long as the command's training. Its
# gradient_accumulation_steps (40, 5 per GPU on 8) reach a batch of 480 sequences from micro-batches of 12: here the
# workload's batch is the micro-batch, and the accum rung reaches the batch rung's K times it in K micro-steps, the
# default of accum_steps. The learning rate stays the run's --lr.
RECIPES: dict[str, dict[str, Any]] = {
    "default": {},
    "nanogpt": {"weight_decay": 0.1, "decay": "2d", "betas": (0.9, 0.95), "grad_clip": 1.0, "schedule": "cosine",
                "warmup_share": 2000 / 600000, "floor": 0.1},
}


def float_pair(text: str) -> tuple[float, float]:
    """'0.9,0.95' -> (0.9, 0.95)."""
    parts = [p.strip() for p in text.split(",")]
    try:
        pair = tuple(float(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give two numbers as B1,B2, got {text!r}") from None
    if len(pair) != 2:
        raise argparse.ArgumentTypeError(f"give two numbers as B1,B2, got {text!r}")
    return pair[0], pair[1]


def clip_norm(text: str) -> float:
    """A clip norm, or off (none, off, inf): no clipping, as clipping at an infinite norm is."""
    if text.strip().lower() in ("none", "off"):
        return math.inf
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a clip norm is a number, or off; got {text!r}") from None


@dataclass(frozen=True)
class RecipeConfig:
    """How the model is trained, beyond its learning rate (RunConfig.lr). Made through the codec (a file, the flags,
    results.json) or `RecipeConfig.named`, so that a name brings its values."""

    name: str = option("default", flag="--recipe", choices=tuple(RECIPES), group=Group.RECIPE,
                       help="a named recipe: default (torch's AdamW at a constant learning rate, no clipping: what "
                            "speedladder always trained) or nanogpt (nanoGPT's train.py: weight decay 0.1 on the 2-D "
                            "parameters, betas 0.9,0.95, clip at norm 1.0, warm-up then cosine decay to a tenth of "
                            "the learning rate); the recipe flags given beside it win over its values")
    weight_decay: float = option(0.01, help="AdamW's weight decay", metavar="W", group=Group.RECIPE)
    decay: str = option("all", flag="--decay-params", choices=DECAY, group=Group.RECIPE,
                        help="which parameters decay: all, or 2d (matrices and embeddings; biases and norms do not, "
                             "as nanoGPT's configure_optimizers splits them)")
    betas: tuple[float, float] = option((0.9, 0.999), help="AdamW's betas", metavar="B1,B2", parse=float_pair,
                                        group=Group.RECIPE)
    eps: float = option(1e-8, help="AdamW's eps", flag="--adam-eps", metavar="E", group=Group.RECIPE)
    grad_clip: float = option(math.inf, help="clip the gradients to this global norm before each update (off: "
                                             "none)", metavar="NORM", parse=clip_norm, shown="off",
                              group=Group.RECIPE)
    schedule: str = option("constant", flag="--lr-schedule", choices=SCHEDULES, group=Group.RECIPE,
                           help="the learning rate after its warm-up: constant, or cosine or linear decay to "
                                "--lr-floor times it at the schedule's end (nanoGPT's get_lr)")
    warmup: int = option(0, flag="--lr-warmup", metavar="N", group=Group.RECIPE,
                         help="a linear warm-up of N steps (or tokens: --schedule-unit) from lr/(N+1) to lr, as "
                              "nanoGPT's; wins over --lr-warmup-share")
    warmup_share: float = option(0.0, flag="--lr-warmup-share", metavar="F", group=Group.RECIPE,
                                 help="the warm-up as this share of the schedule's length, when --lr-warmup is 0")
    length: int | None = option(None, flag="--schedule-length", metavar="N", group=Group.RECIPE,
                                help="steps (or tokens) from the first update to the end of the decay; past it the "
                                     "rate stays at the floor",
                                shown="the command's training: train's --steps, a race's budget, a run's "
                                      "learns-check")
    unit: str = option("steps", flag="--schedule-unit", choices=UNITS, group=Group.RECIPE,
                       help="what --lr-warmup and --schedule-length count: steps (updates of the configuration "
                            "trained; in a race, base steps' worth of tokens) or tokens")
    floor: float = option(0.1, flag="--lr-floor", metavar="F", group=Group.RECIPE,
                          help="the decayed learning rate's floor, a fraction of --lr (nanoGPT's min_lr = lr/10)")
    accum_steps: int | None = option(None, metavar="N", group=Group.RECIPE,
                                     help="gradient accumulation: the accum rung reaches the batch rung's batch in N "
                                          "micro-steps, each of 1/N of it; N must divide --batch-multiplier",
                                     shown="--batch-multiplier: micro-steps of the workload's batch")

    def __post_init__(self) -> None:
        if self.name not in RECIPES:
            raise UsageError(f"unknown recipe {self.name!r} (choose from {', '.join(RECIPES)})")
        for what, value, known in (("schedule", self.schedule, SCHEDULES), ("decay", self.decay, DECAY),
                                   ("schedule unit", self.unit, UNITS)):
            if value not in known:
                raise UsageError(f"unknown {what} {value!r} (choose from {', '.join(known)})")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise UsageError(f"the weight decay must be zero or more, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise UsageError(f"AdamW's betas must be two numbers in [0, 1), got {','.join(map(str, self.betas))}")
        codec.positive("AdamW's eps", self.eps)
        if not self.grad_clip > 0:  # inf (off) passes; NaN does not
            raise UsageError(f"the clip norm must be positive (or off), got {self.grad_clip}")
        codec.at_least("the warm-up", self.warmup, 0)
        if not 0 <= self.warmup_share < 1:
            raise UsageError(f"the warm-up share must be in [0, 1), got {self.warmup_share}")
        codec.positive("the schedule's length", self.length)
        if not 0 <= self.floor <= 1:
            raise UsageError(f"the learning rate's floor must be in [0, 1], got {self.floor}")
        codec.positive("the accumulation steps", self.accum_steps)
        if self.length is not None and self.warmup > self.length:
            raise UsageError(f"a warm-up of {self.warmup:,} {self.unit} is longer than the schedule's "
                             f"{self.length:,}")

    @classmethod
    def named(cls, name: str = "default", **changes: Any) -> RecipeConfig:
        """A named recipe's values, with `changes` on top."""
        return codec.from_data(cls, {"name": name, **changes}, "recipe")

    @classmethod
    def from_plain(cls, data: Mapping[str, Any], where: str = "recipe", unknown: Unknown = "error") -> RecipeConfig:
        """The named recipe's values under the keys given (a file's, the flags', a saved results.json's). JSON has
        no infinity: a clip norm saved as null is off."""
        name = data.get("name", "default")
        if not isinstance(name, str) or name not in RECIPES:
            raise UsageError(f"{where}.name: unknown recipe {name!r} (choose from {', '.join(RECIPES)})")
        merged = {**RECIPES[name], **data}
        if "grad_clip" in merged and merged["grad_clip"] is None:
            merged["grad_clip"] = math.inf
        return codec.from_fields(cls, merged, where, unknown)

    @property
    def clips(self) -> bool:
        return math.isfinite(self.grad_clip)

    @property
    def scheduled(self) -> bool:
        """Whether the learning rate moves at all (a warm-up or a decay): else it is never touched."""
        return self.schedule != "constant" or self.warmup > 0 or self.warmup_share > 0

    def changes(self) -> dict[str, Any]:
        """The fields whose values differ from the named recipe's."""
        base = RecipeConfig.named(self.name)
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(base, f.name)}

    @property
    def is_default(self) -> bool:
        """Today's behaviour: the default recipe, nothing changed (the header then leaves it out)."""
        return self.name == "default" and not self.changes()

    def describe(self) -> str:
        """One line: the name, what differs from it, and what the values mean."""
        changed = self.changes()
        name = self.name + ("" if not changed else " with " + ", ".join(
            f"{k}={_shown(v)}" for k, v in changed.items()))
        decay = "2-D parameters" if self.decay == "2d" else "every parameter"
        warm = (f"warm-up {self.warmup:,} {self.unit}, " if self.warmup else
                f"warm-up {self.warmup_share:.2%} of the schedule, " if self.warmup_share else "")
        lr = ("constant learning rate" if self.schedule == "constant" else
              f"{self.schedule} decay to {self.floor:g}x the learning rate")
        return (f"{name}: AdamW weight decay {self.weight_decay:g} on {decay}, betas {_shown(self.betas)}, eps "
                f"{self.eps:g}; {'clip at norm ' + f'{self.grad_clip:g}' if self.clips else 'no clipping'}; "
                f"{warm}{lr}" + (f"; accum {self.accum_steps} micro-steps" if self.accum_steps else ""))


def _shown(v: Any) -> str:
    if isinstance(v, tuple):
        return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v)
    if isinstance(v, float):
        return "off" if math.isinf(v) else f"{v:g}"
    return str(v)
