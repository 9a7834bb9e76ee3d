"""One rank of a data-parallel job, started by torchrun: `python -m speedladder.parallel.rank JOB.json`.

The parent (`speedladder ddp` or `predict --measure-bandwidth`) writes the job
file and launches torchrun; torchrun sets RANK, LOCAL_RANK and WORLD_SIZE and
watches the workers. Each rank joins the process group (NCCL on CUDA, gloo on
the CPU), then either probes allreduce bandwidth or trains and times the job.
Lines meant for the parent start with `speedladder[rank R]`; a rank that fails
prints one `... error: ...` line and exits non-zero, and torchrun stops the rest.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from speedladder.config.parallel import ParallelConfig
from speedladder.config.settings import run_from_results
from speedladder.errors import one_line
from speedladder.measure import counters, devicemem
from speedladder.parallel import costmodel, section
from speedladder.records import storage
from speedladder.spec import StepSpec
from speedladder.step.measurement import Ranks, measure_spec
from speedladder.step.train_step import matmul_precision
from speedladder.step.workload import prepare

PREFIX = "speedladder[rank "
FAIL_RANK_ENV = "SPEEDLADDER_FAIL_RANK"  # fault injection for the tests: this rank raises before training
DRIFT_RANK_ENV = "SPEEDLADDER_DRIFT_RANK"  # fault injection: this rank's parameters differ after training
DIE_RANK_ENV = "SPEEDLADDER_DIE_RANK"  # fault injection: this rank exits with a traceback, before any line of ours
RANK_SEED_STRIDE = 1000  # each rank draws its own batches: seed + rank * stride


def say(rank: int, message: str) -> None:
    print(f"{PREFIX}{rank}] {message}", flush=True)


class Group:
    """The process group as this rank sees it, and the few collectives the job needs."""

    def __init__(self, device_type: str, threads: int, timeout_s: float) -> None:
        self.rank = int(os.environ["RANK"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        if device_type == "cuda":
            self.device = torch.device("cuda", self.local_rank)  # one process per GPU
            torch.cuda.set_device(self.device)
            backend = "nccl"
        else:
            self.device = torch.device("cpu")
            torch.set_num_threads(threads)  # the k processes share the cores: each gets its share
            backend = "gloo"
        dist.init_process_group(backend, timeout=dt.timedelta(seconds=timeout_s))

    def barrier(self) -> None:
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.local_rank])
        else:
            dist.barrier()

    def edge(self) -> None:
        """A window edge: this rank's queued work done, then every rank's."""
        devicemem.sync(self.device)
        self.barrier()

    def max(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def total(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t)
        return int(t.item())

    def gather(self, values: list[float]) -> list[list[float]]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t)
        return [o.tolist() for o in out]

    def close(self) -> None:
        """Wait for every rank, then leave: gloo can abort at exit if the group is left standing."""
        self.barrier()
        dist.destroy_process_group()


def allreduce_probe(group: Group, pcfg: ParallelConfig, extra_sizes: list[int] | None = None) -> dict:
    """Time fp32 allreduces over a range of message sizes on this group; nccl-tests' algbw and busbw.

    Every size is timed on every rank between barriers, and the slowest rank's
    time is the collective's time. The sizes are the probe's own and the job's
    DDP bucket sizes; latency and bus bandwidth are fitted to all of them
    (costmodel.fit_allreduce), so the model prices the messages the job sends.
    """
    k = group.world
    rows: list[dict[str, Any]] = []
    for size in sorted({*pcfg.probe_sizes, *(extra_sizes or ())}):
        buf = torch.zeros(max(1, size // 4), dtype=torch.float32, device=group.device)  # zeros: sums stay finite
        nbytes = buf.numel() * buf.element_size()
        iters = min(max(pcfg.probe_bytes // nbytes, pcfg.probe_min_iters), pcfg.probe_max_iters)
        for _ in range(pcfg.probe_warmup):
            dist.all_reduce(buf)
        group.edge()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        devicemem.sync(group.device)
        seconds = group.max((time.perf_counter() - t0) / iters)
        busbw = costmodel.busbw_allreduce(nbytes, seconds, k) if k > 1 else None
        rows.append({"bytes": nbytes, "iters": iters, "seconds": seconds, "algbw_GBps": nbytes / seconds / 1e9,
                     "busbw_GBps": None if busbw is None else busbw / 1e9})
    out = {"k": k, "backend": dist.get_backend(), "device_type": group.device.type, "sizes": rows,
           "latency_us": rows[0]["seconds"] * 1e6, "busbw_GBps": rows[-1]["busbw_GBps"], "fit": None}
    if k > 1:
        latency, busbw = costmodel.fit_allreduce([(r["bytes"], r["seconds"]) for r in rows], k)
        for r in rows:  # what the fitted model says of each size, beside what was measured
            r["fitted_seconds"] = costmodel.t_allreduce(r["bytes"], k, busbw, latency)
        out["fit"] = {"latency_us": latency * 1e6, "busbw_GBps": busbw / 1e9,
                      "how": "least squares on the relative error over every size, bucket sizes included",
                      "two_point": {"latency_us": out["latency_us"], "busbw_GBps": out["busbw_GBps"]}}
        out["latency_us"], out["busbw_GBps"] = latency * 1e6, busbw / 1e9
    return out


def fully_shard_fn():
    """FSDP2's fully_shard: public from torch 2.6, under _composable before."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def wrapper(strategy: str, device: torch.device, pcfg: ParallelConfig,
            blocks: Callable[[nn.Module], list[nn.Module]] = lambda m: list(getattr(m, "blocks", []))):
    """The TrainStep `wrap=` hook: applied after the rungs' model transforms, before torch.compile."""
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        # None keeps DDP's default path (25 MiB buckets after a 1 MiB first one): what the cost model prices.
        cap = None if pcfg.bucket_cap_mb == section.DDP_DEFAULT_BUCKET_MB else pcfg.bucket_cap_mb
        return lambda m: DistributedDataParallel(m, device_ids=ids, bucket_cap_mb=cap)
    fully_shard = fully_shard_fn()

    def shard(model: nn.Module) -> nn.Module:
        for block in blocks(model):  # one FSDP unit per block, then the root holds the rest
            fully_shard(block)
        fully_shard(model)
        return model

    return shard


def full_tensor(p: torch.Tensor) -> torch.Tensor:
    """A parameter as a whole tensor: an FSDP2 shard (a DTensor) is all-gathered."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def param_check(group: Group, model: nn.Module) -> dict:
    """After training, every rank's parameters against rank 0's: the largest absolute difference anywhere."""
    with torch.no_grad():
        flat = torch.cat([full_tensor(p).detach().float().reshape(-1) for p in model.parameters()])
        ref = flat.clone()
        dist.broadcast(ref, src=0)
        diff = group.max(float((flat - ref).abs().max()))
    return {"max_abs_diff": diff, "identical": diff == 0.0, "params": flat.numel(),
            "how": "every rank's parameters (FSDP2 shards all-gathered) compared with rank 0's, after the windows"}


def job_ranks(group: Group) -> Ranks:
    """How the job's ranks time a spec together: the compile count summed over ranks, so every rank ends its warm-up
    on the same step; a barrier at each window's edges; the window tokens the whole job's (every rank does
    tokens_per_step a step); on CUDA each rank sizes its windows from its own warm-up and the longest wins, so every
    rank runs as many steps."""
    return Ranks(world=group.world, counter=lambda: group.total(counters.compile_count()), edge=group.edge,
                 agree=lambda n: int(group.max(n)))


def train(job: dict, group: Group) -> dict:
    pcfg = ParallelConfig(**job["parallel_config"])
    work = prepare(run_from_results(job["run"], device=str(group.device)))
    spec = StepSpec.from_dict(job["spec"])
    say_0 = (lambda m: say(group.rank, m)) if group.rank == 0 else (lambda m: None)
    with matmul_precision(spec):
        step = work.step(spec, wrap=wrapper(job["strategy"], group.device, pcfg, work.model.blocks_of),
                         device=group.device)
        stream = work.stream(spec, seed=work.cfg.run.seed + group.rank * RANK_SEED_STRIDE, device=group.device)
        if os.environ.get(FAIL_RANK_ENV) == str(group.rank):
            raise RuntimeError(f"injected failure on rank {group.rank} ({FAIL_RANK_ENV})")
        say_0(f"on {group.world} ranks")
        m, step = measure_spec(work, spec, say_0, step=step, stream=stream, ranks=job_ranks(group))
    per_rank = group.gather([w.seconds for w in m.timing.windows])
    if os.environ.get(DRIFT_RANK_ENV) == str(group.rank):  # fault injection: this rank's model drifts apart
        with torch.no_grad():
            next(step.model.parameters()).add_(1e-3)
    check = param_check(group, step.model)
    if not check["identical"]:  # the ranks trained different models: the job is wrong, however fast
        raise RuntimeError(f"parameters differ across ranks after training (max |difference| "
                           f"{check['max_abs_diff']:.3g}): the job is not data parallel")
    return {"timing": dataclasses.asdict(m.timing), "window_s_per_rank": per_rank, "param_check": check,
            "tokens_per_s": dataclasses.asdict(m.tokens_per_s), "step_ms": m.step_ms}


def run_job(job: dict, group: Group, rank: int) -> None:
    """What a rank does: probe allreduce, or time one process for k = 1, or probe then train and time the job."""
    pcfg = ParallelConfig(**job["parallel_config"])
    if job["mode"] == "single":  # k = 1: the same path as the job's ranks, no probe (nothing to reduce)
        measured = train(job, group)
        if rank == 0:
            Path(job["single_out"]).write_text(json.dumps({
                "threads": job["threads"] if job["device_type"] == "cpu" else None, "device": str(group.device),
                "tokens_per_s": measured["tokens_per_s"], "step_ms": measured["step_ms"],
                "timing": measured["timing"], "via": "torchrun, 1 process, wrapped as the job's ranks are"}))
        return
    probe = allreduce_probe(group, pcfg, job.get("probe_sizes"))
    if job["mode"] == "probe":
        if rank == 0:
            Path(job["probe_out"]).write_text(json.dumps(probe))
        return
    saved = storage.load(job["run_dir"]) if rank == 0 else None
    if saved is not None and saved.parallel is not None:
        section.record_probe(saved.parallel, probe)
        storage.save(saved, Path(job["run_dir"]))
        for line in section.prediction_lines(saved.parallel):
            say(rank, line)
    measured = train(job, group)
    if saved is not None:
        section.record_measured(saved, measured, group.world)
        storage.save(saved, Path(job["run_dir"]))


def main(argv: list[str]) -> None:
    job = json.loads(Path(argv[0]).read_text())
    rank = int(os.environ.get("RANK", "0"))
    if os.environ.get(DIE_RANK_ENV) == str(rank):  # fault injection: dies before it can say why
        raise RuntimeError(f"injected death on rank {rank} before joining the group ({DIE_RANK_ENV})")
    try:
        pcfg = ParallelConfig(**job["parallel_config"])
        group = Group(job["device_type"], job["threads"], pcfg.collective_timeout_s)
        run_job(job, group, rank)
        group.close()
    except BaseException as e:  # noqa: BLE001 -- one line for the parent; torchrun stops the other ranks
        traceback.print_exc()  # into torchrun's log, which the parent keeps
        print(f"{PREFIX}{rank}] error: {one_line(e)}", flush=True)
        sys.stdout.flush()
        os._exit(1)  # no interpreter teardown: a half-open process group can hang or abort there
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # even after destroy_process_group, gloo's threads can abort the interpreter's teardown


if __name__ == "__main__":
    main(sys.argv[1:])
