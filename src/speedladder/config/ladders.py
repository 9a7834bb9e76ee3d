"""The named ladders: which rungs are climbed in which order (the rungs themselves are in rungs.py)."""

from __future__ import annotations

from dataclasses import dataclass

from speedladder.errors import UsageError

# The source text's ladder, R0..R4.
SOURCE_LADDER: tuple[str, ...] = ("eager", "compile", "bf16", "batch", "ckpt")
# The ladder beyond: what the nanoGPT speedrun stacks on top, in the order each builds on the last.
FULL_LADDER: tuple[str, ...] = ("eager", "compile", "bf16", "sdpa", "fused-adamw", "pad-vocab", "batch",
                                "max-autotune", "fp8")


@dataclass(frozen=True)
class LadderDef:
    """A named ladder: rungs climbed in order, then rungs measured beside its top (not built upon)."""

    rungs: tuple[str, ...]
    beside: tuple[str, ...] = ()


# The race's default ladder (speedladder race): the source text's speed rungs, then the rung that changes how the
# model learns rather than how fast a step runs. Checkpointing, a memory rung that trades speed for memory, is left out.
RACE_LADDER: tuple[str, ...] = ("eager", "compile", "bf16", "batch", "muon")

# modded-nanogpt's speedrun on top of the source text's first rungs: compile, bf16 and Muon, then its model records
# (rungs/speedrun.py), each an architecture rung judged by the race's time to a target loss.
SPEEDRUN_LADDER: tuple[str, ...] = ("eager", "compile", "bf16", "muon", "qk-norm", "relu2", "rotary", "softcap")

LADDERS: dict[str, LadderDef] = {
    "source": LadderDef(SOURCE_LADDER),
    "speedrun": LadderDef(SPEEDRUN_LADDER),
    # Checkpointing is a memory rung: measured on the top of the full ladder, not a step for the rest to climb.
    "full": LadderDef(FULL_LADDER, beside=("ckpt",)),
}


# Rungs that each set the step's one autocast precision: two of them in one configuration would make the second
# undo the first.
PRECISION_RUNGS: tuple[str, ...] = ("bf16", "fp16")


def one_precision(names: tuple[str, ...] | list[str]) -> None:
    """A usage error when a ladder or a configuration names two autocast precisions (fp16 together with bf16)."""
    both = [n for n in PRECISION_RUNGS if n in names]
    if len(both) > 1:
        raise UsageError(f"{' and '.join(both)} are two precisions of one step: give one of them (fp16 with its "
                         "gradient scaler where bf16 is missing, bf16 where it runs)")
