"""predict / ddp's record: the priced k, the bandwidth, the single-process measurement and the job's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speedladder.config.parallel import ParallelConfig


@dataclass
class ParallelSection:
    """predict / ddp: the priced k, the bandwidth, the single-process measurement and the job's (parallel/)."""

    command: str
    strategy: str
    nproc: list[int]
    threads_per_process: int
    cpu_cores: int | None
    config: ParallelConfig
    spec: dict[str, Any]
    rungs: list[str]
    tokens_per_step_per_process: int
    grad_bytes: int
    param_bytes: list[int]
    unit_bytes: list[int]
    bucket_cap_bytes: int
    first_bucket_bytes: int
    ddp_buckets: list[int]
    single: dict[str, Any] | None = None
    bandwidth: dict[str, Any] | None = None
    probes: list[dict[str, Any]] = field(default_factory=list)
    predictions: list[dict[str, Any]] = field(default_factory=list)
    measured: dict[str, Any] | None = None
    launch: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
