"""What a model family can do, named once: the key between the models (models/) and the rungs (rungs/).

A rung's Requirement names the capability it needs; a family's transform table is keyed by the capability each
transform provides; a ModelDef says, per capability it lacks, why. The values are the transform names that
StepSpec.transforms and results.json have always carried ("sdpa", "float8", ...), so saved files read the same.
"""

from __future__ import annotations

from enum import Enum


class Capability(str, Enum):
    """A thing a model can have done to it; its value is the name the transform goes by in a StepSpec."""

    BLOCKS = "blocks"  # repeated blocks found (what checkpointing, fp8 and Muon's split act on)
    SDPA = "sdpa"  # attention through F.scaled_dot_product_attention
    PAD_VOCAB = "pad-vocab"  # the vocabulary padded to a multiple of the tile size
    CHECKPOINTING = "activation-checkpointing"  # activation checkpointing of each block
    FLOAT8 = "float8"  # the blocks' linears in fp8

    def __str__(self) -> str:  # the name itself, as a StrEnum prints (Python 3.10 has none)
        return self.value

    @classmethod
    def named(cls, name: str) -> Capability | None:
        """The capability a transform name stands for, or None (a rung's own transform)."""
        return next((c for c in cls if c.value == name), None)

    @property
    def needs(self) -> Capability:
        """The capability a model must have for this one: checkpointing and fp8 act on the blocks."""
        return Capability.BLOCKS if self in (Capability.CHECKPOINTING, Capability.FLOAT8) else self
