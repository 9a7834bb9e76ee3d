"""Capability: the names of what can be done to a model, the one key between the models and the rungs.

A rung's Requirement names the capability it needs, a model family's transform table is keyed by the capability each
transform provides, and a ModelDef says, per capability it lacks, why. Its values are the transform names
StepSpec.transforms and results.json have always held ("sdpa", "float8", ...), so saved files read the same.
"""

from __future__ import annotations

from enum import Enum


class Capability(str, Enum):
    """A thing a model can have done to it; its value is the name the transform goes by in a StepSpec."""

    BLOCKS = "blocks"  # repeated blocks found (what checkpointing, fp8 and Muon's split act on)
    SDPA = "sdpa"  # attention through F.scaled_dot_product_attention
    PAD_VOCAB = "pad-vocab"  # the vocabulary padded to a multiple of the tile size
    CHECKPOINTING = "activation-checkpointing"  # activation checkpointing of each block
    FLOAT8 = "float8"  # the blocks' linears in fp8, torchao's rowwise recipe
    FLOAT8_TENSORWISE = "float8-tensorwise"  # the same, torchao's tensorwise recipe

    def __str__(self) -> str:  # the name itself, as a StrEnum prints (Python 3.10 has none)
        return self.value

    @classmethod
    def named(cls, name: str) -> Capability | None:
        """The capability a transform name stands for, or None (a rung's own transform)."""
        return next((c for c in cls if c.value == name), None)

    @property
    def needs(self) -> Capability:
        """The capability a model must have for this one: checkpointing and fp8 act on the blocks."""
        acts_on_blocks = (Capability.CHECKPOINTING, Capability.FLOAT8, Capability.FLOAT8_TENSORWISE)
        return Capability.BLOCKS if self in acts_on_blocks else self

    @property
    def float8_recipe(self) -> str | None:
        """torchao's recipe where this runs the blocks' linears in fp8, else None."""
        return {Capability.FLOAT8: "rowwise", Capability.FLOAT8_TENSORWISE: "tensorwise"}.get(self)


FP8_TRANSFORMS = tuple(c for c in Capability if c.float8_recipe)  # each runs the blocks' linears in fp8
