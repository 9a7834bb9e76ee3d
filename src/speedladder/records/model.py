"""What results.json (its "model" object) and a checkpoint keep about the model a run climbed: ModelDef.record()."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from speedladder.config import codec


@dataclass(frozen=True)
class ModelRecord:
    """A model as results.json names it, and what `models.rebuild` builds it again from."""

    kind: str  # "speedladder" (our GPT), "hf" (Hugging Face) or "user"
    name: str
    # How it was asked for: {"preset"}, {"hf", "hf_set", "model_type", "config"} or {"model", "arguments"}.
    source: dict[str, Any] = field(default_factory=dict)
    convention: str = "logits"  # a key of models.CONVENTIONS
    convention_means: str = ""
    vocab_size: int = 0
    flops_method: str = "counted"  # "formula" or "counted"
    blocks: str | None = None
    dropout: str = "none"
    not_applicable: dict[str, str] = field(default_factory=dict)  # capability -> why its rungs do not apply

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelRecord:
        """A record read back from results.json or a checkpoint (other keys beside it, e.g. params, are skipped)."""
        return codec.from_data(cls, d, "model", unknown="skip")
