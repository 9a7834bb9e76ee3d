"""results.json's "corpus": the text or token file the run measured on, and how it was split."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CorpusRecord:
    """The corpus as saved (workload.new_results); a file from before the val split (schema 1) has only the first
    four fields."""

    source: str | None = None  # an embedded corpus's name, or a file's path
    tokenizer: str | None = None
    tokens: int = 0  # the --data file's tokens: the val split is inside it unless it has a file of its own
    vocab_size: int | None = None
    train_tokens: int | None = None
    val_tokens: int | None = None
    val_from: str | None = None  # where the val split came from, in words
    extra: dict[str, Any] = field(default_factory=dict)
