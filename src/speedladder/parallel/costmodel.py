"""The cost model of data parallelism: every formula in one place, each with its source.

Pure functions of sizes, k (processes), bandwidth and time; no torch. Units:
bytes, seconds, bytes per second. Bandwidth is the *bus* bandwidth as
nccl-tests define it (PERFORMANCE.md): for an allreduce, busbw = algbw * 2(k-1)/k,
where algbw = message bytes / time; for an all-gather or a reduce-scatter,
busbw = algbw * (k-1)/k. busbw does not depend on k for an ideal ring, which is
why one measured busbw prices every k.

Assumptions, stated once:
- gradients are fp32, 4 bytes a parameter, also under bf16 autocast (the
  parameters stay fp32, so do their gradients);
- backward is 2/3 of a step's compute (4N of the 6N FLOPs per token), and
  gradients become ready during it;
- a reduction that can overlap backward hides under it, except the last bucket
  (ready only when backward ends) and whatever does not fit under backward;
- the latency term is one per collective call (the measured time of a
  smallest-message allreduce, which already includes the ring's 2(k-1) hops).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

GRAD_BYTES_PER_PARAM = 4  # fp32 gradients (bf16 autocast keeps fp32 parameters and gradients)
MIB = 1 << 20


def grad_bytes(n_params: int, bytes_per_param: int = GRAD_BYTES_PER_PARAM) -> int:
    """Bytes of gradient one step reduces: every parameter once (a tied matrix once)."""
    return n_params * bytes_per_param


def allreduce_factor(k: int) -> float:
    """Ring allreduce moves 2(k-1)/k of the message through each link (Patarasuk & Yuan 2009; nccl-tests)."""
    return 2 * (k - 1) / k


def gather_factor(k: int) -> float:
    """Ring all-gather / reduce-scatter move (k-1)/k of the full message through each link (nccl-tests)."""
    return (k - 1) / k


def busbw_allreduce(nbytes: int, seconds: float, k: int) -> float:
    """nccl-tests' bus bandwidth of one allreduce: algbw * 2(k-1)/k, algbw = bytes / time."""
    return nbytes / seconds * allreduce_factor(k)


def t_allreduce(nbytes: float, k: int, busbw: float, latency: float) -> float:
    """Seconds of one ring allreduce of nbytes over k processes: latency + 2(k-1)/k * bytes / busbw."""
    if k == 1:
        return 0.0  # one process: nothing to reduce
    return latency + allreduce_factor(k) * nbytes / busbw


def fit_allreduce(sizes: Sequence[tuple[int, float]], k: int) -> tuple[float, float]:
    """Latency (s) and bus bandwidth (B/s) of t = latency + 2(k-1)/k * bytes / busbw, fitted to measured
    (bytes, seconds) pairs by least squares on the *relative* error, so a 4-byte message and a 64 MiB one weigh
    alike, and the sizes in between (DDP's buckets among them) are priced by the same two numbers."""
    if k < 2 or len(sizes) < 2:
        raise ValueError("a fit needs at least two sizes and two processes")
    # Weighted linear least squares for (latency, slope) with weights 1/t: minimise sum(((a + b n - t) / t)^2).
    sww = swwn = swwnn = swwt = swwnt = 0.0
    for n, t in sizes:
        w2 = 1.0 / (t * t)
        sww, swwn, swwnn = sww + w2, swwn + w2 * n, swwnn + w2 * n * n
        swwt, swwnt = swwt + w2 * t, swwnt + w2 * n * t
    det = sww * swwnn - swwn * swwn
    latency = (swwt * swwnn - swwn * swwnt) / det
    slope = (sww * swwnt - swwn * swwt) / det
    if latency < 0 or slope <= 0:  # noise past what two numbers can model: keep the slope through the origin
        latency = 0.0
        slope = sum(t / n / (t * t) * n * n for n, t in sizes) / sum(n * n / (t * t) for n, t in sizes)
    return latency, allreduce_factor(k) / slope


def t_gather(nbytes: float, k: int, busbw: float, latency: float) -> float:
    """Seconds of one ring all-gather (or reduce-scatter) whose full size is nbytes."""
    if k == 1:
        return 0.0
    return latency + gather_factor(k) * nbytes / busbw


def ddp_buckets(param_bytes: Sequence[int], bucket_cap: int, first_cap: int) -> list[int]:
    """Bucket sizes in the order DDP reduces them.

    DDP (Li et al., VLDB 2020) fills buckets in reverse registration order
    (roughly the order backward produces gradients); a bucket closes once it
    holds at least its cap, a tensor is never split; the first bucket's cap is
    `first_cap` (reducer.cpp compute_bucket_assignment_by_size).
    """
    buckets: list[int] = []
    size, cap = 0, first_cap
    for b in reversed(param_bytes):
        size += b
        if size >= cap:
            buckets.append(size)
            size, cap = 0, bucket_cap
    if size:
        buckets.append(size)
    return buckets


def t_compute(tokens_per_step: int, tokens_per_s: float) -> float:
    """Seconds of one step's compute on one device, from its measured end-to-end tokens/s."""
    return tokens_per_step / tokens_per_s


def exposed(total: float, unhidden: float, hide_under: float) -> float:
    """Communication left on the critical path: the part that cannot start before compute ends
    (`unhidden`, e.g. the last bucket) plus whatever of the rest does not fit under `hide_under`."""
    return unhidden + max(0.0, total - unhidden - hide_under)


def tokens_per_s(k: int, tokens_per_step: int, step_s: float) -> float:
    """Throughput of the whole job: k processes each doing tokens_per_step per step."""
    return k * tokens_per_step / step_s


def efficiency(job_tokens_per_s: float, k: int, single_tokens_per_s: float) -> float:
    """Scaling efficiency: the job's tokens/s over k times one device's."""
    return job_tokens_per_s / (k * single_tokens_per_s)


@dataclass(frozen=True)
class Comm:
    """One step's communication: total time, the part that cannot overlap, and what it can hide under."""

    bytes: int  # bytes one process sends through the collectives' inputs per step (before the ring factor)
    messages: int  # collective calls per step
    total_s: float
    unhidden_s: float
    exposed_s: float  # what the overlap-aware estimate adds to compute


def ddp_comm(param_bytes: Sequence[int], k: int, busbw: float, latency: float, compute_s: float,
             bucket_cap: int, first_cap: int, backward_fraction: float) -> Comm:
    """DDP: one allreduce per bucket, overlapped with backward except the last bucket."""
    buckets = ddp_buckets(param_bytes, bucket_cap, first_cap)
    times = [t_allreduce(b, k, busbw, latency) for b in buckets]
    total = sum(times)
    last = times[-1] if times else 0.0
    return Comm(sum(buckets), len(buckets), total, last, exposed(total, last, backward_fraction * compute_s))


def fsdp_comm(unit_bytes: Sequence[int], k: int, busbw: float, latency: float, compute_s: float,
              backward_fraction: float) -> Comm:
    """FSDP2 (fully_shard per block, then the root): per unit, an all-gather before forward, another
    before backward, and a reduce-scatter of its gradients, each (k-1)/k * bytes / busbw.

    Units are given in forward order, the root (embeddings, head) first. FSDP2
    keeps the root's parameters gathered from forward to backward, so the root
    is all-gathered once. Prefetching hides a unit's gathers under the previous
    unit's compute: in forward only the first gather is exposed, in backward the
    first gather and the last reduce-scatter, plus what does not fit under
    forward (1 - backward_fraction of compute) and backward.
    """
    if not unit_bytes:
        return Comm(0, 0, 0.0, 0.0, 0.0)
    gathers = [t_gather(b, k, busbw, latency) for b in unit_bytes]
    scatters = [t_gather(b, k, busbw, latency) for b in unit_bytes]
    fwd_total = sum(gathers)
    bwd_gathers = gathers[1:]  # not the root's: it stays gathered
    bwd_total = sum(bwd_gathers) + sum(scatters)
    fwd_unhidden = gathers[0]
    bwd_unhidden = (bwd_gathers[-1] if bwd_gathers else 0.0) + scatters[0]  # last block first; root scatters last
    t_fwd = (1 - backward_fraction) * compute_s
    t_bwd = backward_fraction * compute_s
    exp = exposed(fwd_total, fwd_unhidden, t_fwd) + exposed(bwd_total, bwd_unhidden, t_bwd)
    nbytes = 2 * sum(unit_bytes) - unit_bytes[0] + sum(unit_bytes)
    return Comm(nbytes, len(gathers) + len(bwd_gathers) + len(scatters), fwd_total + bwd_total,
                fwd_unhidden + bwd_unhidden, exp)


@dataclass(frozen=True)
class Prediction:
    k: int
    strategy: str
    comm_bytes: int
    messages: int
    t_compute_s: float
    t_comm_s: float
    t_exposed_s: float
    floor_tokens_per_s: float  # no overlap: k * tokens / (t_compute + t_comm)
    overlap_tokens_per_s: float  # k * tokens / (t_compute + exposed communication)
    floor_efficiency: float
    overlap_efficiency: float


def predict(k: int, strategy: str, tokens_per_step: int, single_tokens_per_s: float,
            param_bytes: Sequence[int], unit_bytes: Sequence[int], busbw: float, latency: float,
            bucket_cap: int, first_cap: int, backward_fraction: float) -> Prediction:
    """Price one k: the no-overlap floor and the overlap-aware estimate, with their efficiencies."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if not (busbw > 0 and math.isfinite(busbw)):
        raise ValueError(f"bus bandwidth must be positive and finite, got {busbw}")
    tc = t_compute(tokens_per_step, single_tokens_per_s)
    if strategy == "ddp":
        comm = ddp_comm(param_bytes, k, busbw, latency, tc, bucket_cap, first_cap, backward_fraction)
    elif strategy == "fsdp":
        comm = fsdp_comm(unit_bytes, k, busbw, latency, tc, backward_fraction)
    else:
        raise ValueError(f"unknown strategy {strategy!r}")
    floor = tokens_per_s(k, tokens_per_step, tc + comm.total_s)
    overlap = tokens_per_s(k, tokens_per_step, tc + comm.exposed_s)
    return Prediction(k, strategy, comm.bytes, comm.messages, tc, comm.total_s, comm.exposed_s, floor, overlap,
                      efficiency(floor, k, single_tokens_per_s), efficiency(overlap, k, single_tokens_per_s))


def relative_error(measured: float, predicted: float) -> float:
    """(measured - predicted) / predicted: positive when the job beat the prediction."""
    return (measured - predicted) / predicted


# Unidirectional NVLink bandwidth per GPU from NVIDIA's datasheets (GB/s): the ceiling a ring allreduce's
# busbw approaches on one NVLink/NVSwitch node. Used only when nothing is measured or given, labelled as
# an assumption (optimistic: nccl-tests usually reach 70-90% of it). Matched by substring, first match wins.
NVLINK_GBPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 300.0),  # NVLink bridge: 600 GB/s bidirectional
    ("H100", 450.0),  # SXM, NVLink 4: 900 GB/s bidirectional
    ("H200", 450.0),  # NVLink 4: 900 GB/s bidirectional
    ("A100", 300.0),  # SXM, NVLink 3: 600 GB/s bidirectional
)


def datasheet_busbw_gbps(device_name: str) -> float | None:
    for key, gbps in NVLINK_GBPS:
        if key in device_name:
            return gbps
    return None
