"""Data parallelism's configuration: the cost model's constants, the allreduce probe, the torchrun launch."""

from __future__ import annotations

from dataclasses import dataclass

from speedladder.codec import Group, option, positive, rungs_option
from speedladder.errors import UsageError

STRATEGIES: tuple[str, ...] = ("ddp", "fsdp")


def _nproc(text: str) -> int:
    import argparse

    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid process count: {text!r} (a whole number of at least 1)") from None
    if k < 1:
        raise argparse.ArgumentTypeError(f"invalid process count: {k} (at least 1)")
    return k


def _nproc_list(text: str) -> tuple[int, ...]:
    import argparse

    ks = tuple(_nproc(t.strip()) for t in text.split(",") if t.strip())
    if not ks:
        raise argparse.ArgumentTypeError("no process count given")
    return tuple(sorted(set(ks)))


@dataclass(frozen=True)
class ParallelConfig:
    """Data parallelism: the cost model's constants, the allreduce probe and the torchrun launch."""

    strategy: str = option("ddp", help="ddp: DistributedDataParallel; fsdp: FSDP2 fully_shard per block and the "
                                       "root", choices=STRATEGIES, group=Group.PARALLEL)
    nproc: int = option(2, help="`ddp`: processes per node (one per GPU on CUDA)", metavar="K", parse=_nproc,
                        flag="--nproc", group=Group.DDP)
    predict_nproc: tuple[int, ...] = option((2, 4, 8), help="`predict`: the process counts priced", metavar="K,K,...",
                                            parse=_nproc_list, flag="--nprocs", was="--nproc", group=Group.PREDICT)
    rungs: tuple[str, ...] | None = rungs_option(
        None, help="the configuration these rungs compose to, applied in order without gates: what each process "
                   "runs", shown="the default ladder's rungs (eager,compile,bf16,batch,ckpt), composed",
        flag="--compose", was="--rungs", group=Group.PARALLEL)
    # DDP's default bucket cap, MiB (Li et al., VLDB 2020; torch's DDP default).
    bucket_cap_mb: float = option(25.0, help="DDP bucket size in MiB", metavar="MB", group=Group.PARALLEL)
    bandwidth_gbps: float | None = option(None, help="`predict`: bus bandwidth (nccl-tests' busbw) in GB/s",
                                          shown="measured with --measure-bandwidth, else a datasheet NVLink figure on "
                                                "known GPUs (labelled as assumed), else required",
                                          flag="--bandwidth", metavar="GBps", group=Group.PREDICT)
    measure_bandwidth: bool = option(False, help="`predict`: run an allreduce probe over k processes (torchrun) for "
                                                 "each k; its busbw and latency feed the cost model",
                                     flag="--measure-bandwidth", group=Group.PREDICT)
    latency_us: float | None = option(None, help="`predict`: per-message latency in µs with --bandwidth",
                                      shown="measured with --measure-bandwidth, else assumed 20", metavar="US",
                                      group=Group.PREDICT)
    # DDP rebuilds its buckets after the first step in gradient-ready order with a first bucket of 1 MiB
    # (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES), so the first reduction starts early.
    first_bucket_mb: float = option(1.0, help="DDP's first bucket after its rebuild, MiB", cli=False)
    backward_fraction: float = option(2 / 3, help="backward's share of a step's compute: 4N of the 6N FLOPs per "
                                                  "token", cli=False)
    # Per-message latency when none is measured: an assumption of the order of NCCL's small-message
    # allreduce on NVLink (tens of microseconds), never presented as measured.
    assumed_latency_us: float = option(20.0, help="the latency assumed when none is measured or given", cli=False)
    # Allreduce probe: message sizes in bytes (the smallest one's time is the latency; the largest one's
    # bus bandwidth is the beta fed to the cost model, as nccl-tests report busbw at large sizes).
    probe_sizes: tuple[int, ...] = option((4, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20),
                                          help="the probe's message sizes, bytes", cli=False)
    probe_warmup: int = option(2, help="untimed allreduces per size (connection set-up, allocator)", cli=False)
    probe_bytes: int = option(256 << 20, help="each size runs about this many bytes in total ...", cli=False)
    probe_min_iters: int = option(3, help="... with at least this many ...", cli=False)
    probe_max_iters: int = option(50, help="... and at most this many timed allreduces", cli=False)
    # torchrun: these are passed through unchanged; multi-node runs set nnodes, node_rank and rdzv_*.
    nnodes: str = option("1", help="torchrun: nodes", group=Group.TORCHRUN)
    node_rank: int = option(0, help="torchrun: this node's rank (static rendezvous)", group=Group.TORCHRUN)
    master_addr: str = option("127.0.0.1", help="torchrun: address of node 0 (static rendezvous)", group=Group.TORCHRUN)
    master_port: int = option(29500, help="torchrun: port on node 0; checked free before the launch",
                              group=Group.TORCHRUN)  # torchrun's own default
    rdzv_backend: str = option("c10d", help="torchrun: rendezvous backend with --rdzv-endpoint", group=Group.TORCHRUN)
    rdzv_endpoint: str | None = option(None, help="torchrun: dynamic rendezvous endpoint (replaces --master-addr/"
                                                  "--master-port)", shown="none", metavar="HOST:PORT",
                                       group=Group.TORCHRUN)
    rdzv_id: str | None = option(None, help="torchrun: job id shared by the nodes, with --rdzv-endpoint",
                                 shown="torchrun's", group=Group.TORCHRUN)
    monitor_interval_s: float = option(0.5, help="how often torchrun checks its workers: a failed rank stops the "
                                                 "job this fast", cli=False)
    collective_timeout_s: float = option(600.0, help="a collective waiting longer fails (first-step compiles can "
                                                     "take minutes)", cli=False)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise UsageError(f"unknown strategy {self.strategy!r} (choose ddp or fsdp)")
        if not self.bucket_cap_mb > 0:
            raise UsageError(f"--bucket-cap-mb must be positive, got {self.bucket_cap_mb}")
        if self.nproc < 1:
            raise UsageError(f"--nproc must be at least 1, got {self.nproc}")
        if any(k < 1 for k in self.predict_nproc):
            raise UsageError(f"--nprocs must be at least 1, got {min(self.predict_nproc)}")
        if self.bandwidth_gbps is not None and not self.bandwidth_gbps > 0:
            raise UsageError(f"--bandwidth must be positive, got {self.bandwidth_gbps}")
        if self.latency_us is not None and not self.latency_us >= 0:
            raise UsageError(f"--latency-us must be zero or more, got {self.latency_us}")
        if self.bandwidth_gbps is not None and self.measure_bandwidth:
            raise UsageError("give --bandwidth or --measure-bandwidth, not both")
        positive("the monitor interval", self.monitor_interval_s)
