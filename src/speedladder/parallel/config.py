"""Data parallelism's configuration: the cost model's constants, the allreduce probe, the torchrun launch."""

from __future__ import annotations

from dataclasses import dataclass

STRATEGIES: tuple[str, ...] = ("ddp", "fsdp")


@dataclass(frozen=True)
class ParallelConfig:
    """Data parallelism: the cost model's constants, the allreduce probe and the torchrun launch."""

    strategy: str = "ddp"  # "ddp" (DistributedDataParallel) or "fsdp" (FSDP2 fully_shard per block + root)
    nproc: int = 2  # `ddp`: processes per node
    predict_nproc: tuple[int, ...] = (2, 4, 8)  # `predict`: the k priced
    bucket_cap_mb: float = 25.0  # DDP's default bucket cap, MiB (Li et al., VLDB 2020; torch's DDP default)
    # DDP rebuilds its buckets after the first step in gradient-ready order with a first bucket of 1 MiB
    # (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES), so the first reduction starts early.
    first_bucket_mb: float = 1.0
    backward_fraction: float = 2 / 3  # backward's share of a step's compute: 4N of the 6N FLOPs per token
    # Per-message latency when none is measured: an assumption of the order of NCCL's small-message
    # allreduce on NVLink (tens of microseconds), never presented as measured.
    assumed_latency_us: float = 20.0
    # Allreduce probe: message sizes in bytes (the smallest one's time is the latency; the largest one's
    # bus bandwidth is the beta fed to the cost model, as nccl-tests report busbw at large sizes).
    probe_sizes: tuple[int, ...] = (4, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)
    probe_warmup: int = 2  # untimed allreduces per size (connection set-up, allocator)
    probe_bytes: int = 256 << 20  # each size runs about this many bytes in total ...
    probe_min_iters: int = 3  # ... with at least this many ...
    probe_max_iters: int = 50  # ... and at most this many timed allreduces
    # torchrun: these are passed through unchanged; multi-node runs set nnodes, node_rank and rdzv_*.
    nnodes: str = "1"
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500  # torchrun's own default
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    monitor_interval_s: float = 0.5  # how often torchrun checks its workers: a failed rank stops the job this fast
    collective_timeout_s: float = 600.0  # a collective waiting longer fails (first-step compiles can take minutes)
