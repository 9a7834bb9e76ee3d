"""Where a result was measured: the machine, the versions, the commit (results.environment writes it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Environment:
    """The environment a result needs to be trusted; a field a file of an older version lacks is None."""

    device: str | None = None  # "cpu", "cuda:0", ...
    device_type: str | None = None
    device_name: str | None = None
    torch: str | None = None
    cuda: str | None = None  # None: a CPU build of torch
    cudnn: int | None = None
    driver: str | None = None
    cuda_capability: list[int] | None = None
    python: str | None = None
    platform: str | None = None
    cpu: str | None = None
    cpu_threads: int | None = None
    # The CPU's vector ISA and whether bf16 is native there (processor.py): what a CPU verdict rests on.
    cpu_capability: str | None = None
    bf16_native: bool | None = None
    bf16_why: str | None = None
    muon: str | None = None  # how the muon rung iterates here
    speedladder: str | None = None
    git_commit: str | None = None  # with "-dirty" when the tree had changes; None outside a checkout
    extra: dict[str, Any] = field(default_factory=dict)
