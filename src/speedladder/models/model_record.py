"""What results.json (its "model" object) and a checkpoint keep about the model a run climbed: ModelDef.record()."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from speedladder import codec


@dataclass(frozen=True)
class ModelRecord:
    """A model as results.json names it, and what `models.build.rebuild` builds it again from."""

    kind: str  # "speedladder" (our GPT), "hf" (Hugging Face) or "user"
    name: str
    # How it was asked for: {"preset"}, {"hf", "hf_set", "model_type", "config"} or {"model", "arguments"}.
    source: dict[str, Any] = field(default_factory=dict)
    convention: str = "logits"  # a key of models.definition.CONVENTIONS
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


@dataclass
class SavedModel:
    """results.json's "model": the preset and parameter counts, then the ModelRecord's fields, flat, as saved.
    A file from before other models (schema 1) has only the first three: the rest take their defaults."""

    preset: str | None = None
    params: int = 0
    matmul_params: int | None = None
    kind: str = "speedladder"  # a file from before other models climbed our GPT
    name: str = ""
    source: dict[str, Any] = field(default_factory=dict)
    convention: str = "logits"
    convention_means: str = ""  # empty in a file from before other models
    vocab_size: int = 0
    flops_method: str = "counted"
    blocks: str | None = None
    dropout: str = "none"
    not_applicable: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, preset: str | None, params: int, matmul_params: int | None, record: ModelRecord) -> SavedModel:
        """The saved form of a workload's model: its counts beside its record."""
        return cls(preset, params, matmul_params, **dataclasses.asdict(record))
