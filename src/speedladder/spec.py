"""What one training step is: StepSpec, the configuration every rung transforms and step/train_step.py makes real.

It sits below the rungs and the records that read it; its transforms are named by models/capability.py's values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from speedladder import codec
from speedladder.models.capability import Capability


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
