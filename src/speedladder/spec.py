"""What one training step is: StepSpec, beside TrainStep (step.py) and below the records and the rungs that read it,
and Capability, the names of what a model can have done to it, which its transforms carry.

Capability is the key between the models (models/) and the rungs (rungs/): a rung's Requirement names the capability
it needs, a model family's transform table is keyed by the capability each transform provides, and a ModelDef says,
per capability it lacks, why. Its values are the transform names StepSpec.transforms and results.json have always
held ("sdpa", "float8", ...), so saved files read the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from speedladder.config import codec


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


@dataclass(frozen=True)
class StepSpec:
    """One training step's configuration; the defaults are R0, eager fp32."""

    batch_size: int
    seq_len: int
    compile: bool = False  # torch.compile the model (forward, loss and backward)
    autocast: str | None = None  # None (fp32), "bf16", or "fp16" (with a gradient scaler)
    tf32: bool = False  # fp32 matmuls on tensor cores (CUDA only)
    transforms: tuple[str, ...] = ()  # names in MODEL_TRANSFORMS, applied in order
    compile_mode: str | None = None  # torch.compile's mode: None (default), "max-autotune", "reduce-overhead"
    optimizer: str = "adamw"  # "adamw", "adamw-fused", "adamw-foreach", "muon", or a rung's own (OPTIMIZERS)
    lr_scale: float = 1.0  # every optimizer's learning rate times this (the batch rung's --batch-lr-scale rule)
    accum: int = 1  # micro-steps per update: each of batch_size / accum sequences, gradients accumulated (accum rung)

    @property
    def precision(self) -> str:
        """The arithmetic the matmuls run in: what the MFU peak and the gate tolerance depend on."""
        if self.float8_recipe is not None:
            return "fp8"
        if self.autocast in ("bf16", "fp16"):
            return self.autocast
        return "tf32" if self.tf32 else "fp32"

    @property
    def float8_recipe(self) -> str | None:
        """torchao's recipe where a transform runs the blocks' linears in fp8 (rowwise or tensorwise), else None."""
        return next((c.float8_recipe for c in map(Capability.named, self.transforms) if c and c.float8_recipe), None)

    @property
    def tokens_per_step(self) -> int:
        """Tokens one update trains on (every micro-step of it)."""
        return self.batch_size * self.seq_len

    @property
    def micro_batch(self) -> int:
        """Sequences in one forward and backward: the batch, or a micro-batch of it under accumulation."""
        return self.batch_size // self.accum

    @property
    def cudagraphs(self) -> bool:
        """Whether compiled code replays CUDA graphs, whose outputs the next replay overwrites."""
        return self.compile and self.compile_mode in ("max-autotune", "reduce-overhead")

    @property
    def same_update(self) -> bool:
        """AdamW in any implementation at eager's learning rate: the same update rule, so the loss band applies."""
        return self.optimizer in ADAMW_VARIANTS and self.lr_scale == 1.0

    @property
    def update_change(self) -> str:
        """Why this spec's updates differ from eager's (empty when they do not)."""
        parts = ([f"{self.optimizer} updates differently from AdamW"] if self.optimizer not in ADAMW_VARIANTS else [])
        if self.lr_scale != 1.0:
            parts.append(f"its learning rate is {self.lr_scale:.3g}x eager's")
        return " and ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return codec.to_data(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepSpec:
        """A spec saved in results.json or a winner.toml, through the one codec: lists become the tuples, types are
        checked, a field added later takes its default, one a later version added is skipped."""
        return codec.from_data(cls, d, "spec", unknown="skip")


ADAMW_VARIANTS = ("adamw", "adamw-fused", "adamw-foreach")
