"""predict / ddp's record: the priced k, the bandwidth, the single-process measurement and the job's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speedladder.config.parallel import ParallelConfig
from speedladder.measure.judging import Spread
from speedladder.spec import StepSpec


@dataclass
class SingleProcess:
    """k = 1 measured: the t_compute every prediction starts from."""

    device: str
    tokens_per_s: Spread
    step_ms: float
    threads: int | None = None  # a CPU process's threads; None on a GPU
    timing: dict[str, Any] | None = None  # measure/timer.Timing as saved
    via: str | None = None  # how it ran; None in schema 1, which measured it in the parent process
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Bandwidth:
    """The allreduce figures every k is priced with: given, measured by a probe, or from a datasheet."""

    source: str  # "given", "measured", "datasheet" or "none" (one process: nothing to reduce)
    busbw_GBps: float | None
    latency_us: float | None
    note: str
    probe_k: int | None = None  # the probe whose figures price the k that had none of their own
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProbeSize:
    """One message size of an allreduce probe: its time and nccl-tests' algbw and busbw."""

    bytes: int
    iters: int
    seconds: float
    algbw_GBps: float
    busbw_GBps: float | None = None  # None for one process
    extra: dict[str, Any] = field(default_factory=dict)  # the fitted model's seconds, when fitted


@dataclass
class Probe:
    """An allreduce probe over k processes (parallel/worker.allreduce_probe): each size, and the fitted figures."""

    k: int
    backend: str
    sizes: list[ProbeSize] = field(default_factory=list)
    busbw_GBps: float | None = None
    latency_us: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # device type, the fit and how


@dataclass
class KPrediction:
    """One k priced (parallel/costmodel.predict): the floor without overlap and the overlap-aware estimate."""

    k: int
    strategy: str
    comm_bytes: int
    messages: int
    t_compute_s: float
    t_comm_s: float
    t_exposed_s: float
    floor_tokens_per_s: float
    overlap_tokens_per_s: float
    floor_efficiency: float
    overlap_efficiency: float
    busbw_GBps: float | None = None
    latency_us: float | None = None
    from_probe_k: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ParamCheck:
    """Every rank's parameters against rank 0's after the windows."""

    identical: bool
    max_abs_diff: float
    params: int
    how: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class MeasuredJob:
    """The k-process job measured: the whole job's tokens/s, its efficiency and its errors against the prices."""

    k: int
    tokens_per_s: Spread
    param_check: ParamCheck
    efficiency: float
    floor_error: float | None = None
    overlap_error: float | None = None
    flags: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # every window's figures, rank 0's timing


@dataclass
class ParallelSection:
    """predict / ddp: the priced k, the bandwidth, the single-process measurement and the job's (parallel/)."""

    command: str
    strategy: str
    nproc: list[int]
    threads_per_process: int
    cpu_cores: int | None
    config: ParallelConfig
    spec: StepSpec
    rungs: list[str]
    tokens_per_step_per_process: int
    grad_bytes: int
    param_bytes: list[int]
    unit_bytes: list[int]
    bucket_cap_bytes: int
    first_bucket_bytes: int
    ddp_buckets: list[int]
    single: SingleProcess | None = None
    bandwidth: Bandwidth | None = None
    probes: list[Probe] = field(default_factory=list)
    predictions: list[KPrediction] = field(default_factory=list)
    measured: MeasuredJob | None = None
    launch: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def prediction(self, k: int) -> KPrediction | None:
        """The prediction for k processes, when k was priced."""
        return next((p for p in self.predictions if p.k == k), None)
