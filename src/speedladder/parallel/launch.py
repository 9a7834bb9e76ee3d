"""Data parallelism, priced and then measured: the parent side of `predict` and `ddp`.

The flow: resolve the workload as `run` does; compose the chosen rungs into one
step spec; measure one process's tokens/s with the same windows as `run`;
get the allreduce bandwidth (given, measured by a probe over the real process
group, or a datasheet figure labelled as an assumption); price every k with
costmodel; for `ddp`, launch the job through torchrun (`python -m
torch.distributed.run`, nothing home-made for launch or transport) and compare.
Everything lands in results.json under `parallel`; reports read it back.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from speedladder import subproc
from speedladder.codec import to_data
from speedladder.config.parallel import ParallelConfig
from speedladder.config.run import RunConfig
from speedladder.errors import UsageError
from speedladder.parallel import costmodel
from speedladder.parallel.section import new_section, price, single_prediction
from speedladder.progress import Progress
from speedladder.records import Results, from_dict, storage
from speedladder.records.parallel_section import Bandwidth, Probe, SingleProcess
from speedladder.rungs import RUNGS, compose
from speedladder.spec import StepSpec
from speedladder.step.workload import Workload, new_results, prepare

JOB_FILE = "job.json"
LOG_FILE = "torchrun.log"
_RANK_LINE = re.compile(r"^speedladder\[rank (\d+)\] (error: )?(.*)$")


def cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_per_process(k: int) -> int:
    """On a CPU the k processes share this machine's cores: each gets its share, at least one thread."""
    return max(1, cpu_cores() // k)


def chosen_spec(work: Workload) -> StepSpec:
    """The composed rungs on the workload's base spec; a rung that cannot run here is a usage error."""
    for name in work.cfg.run.rungs or ():
        unmet = RUNGS[name].requires.unmet(work.env)
        if unmet:
            raise UsageError(f"rung {name} cannot run here: {unmet}")
    spec = compose(work.cfg.run.rungs or (), work.base_spec, work.env)
    if spec.tokens_per_step > work.corpus.n_tokens - 1:
        raise UsageError(f"batch {spec.batch_size} x {spec.seq_len} after the rungs exceeds the corpus "
                         f"({work.corpus.n_tokens - 1:,} usable tokens)")
    return spec


def check_nproc(k: int, device: torch.device, flag: str = "--nproc") -> None:
    """k processes can run here; a usage error that names `flag` (ddp's --nproc, predict's --nprocs) otherwise."""
    if k < 1:
        raise UsageError(f"{flag} must be at least 1, got {k}")
    if device.type == "cuda" and k > torch.cuda.device_count():
        raise UsageError(f"{flag} {k} asks for more processes than this node's {torch.cuda.device_count()} "
                         "CUDA device(s): one process per GPU")
    if device.type == "mps":
        raise UsageError("data parallelism needs CUDA (NCCL) or the CPU (gloo); MPS has no process-group backend")


def check_port(pcfg: ParallelConfig) -> None:
    """The rendezvous port must be free before the launch: torchrun would otherwise fail in a wall of text."""
    if pcfg.rdzv_endpoint is not None or pcfg.node_rank != 0:
        return  # the rendezvous lives elsewhere, or on another node
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is usable
        try:
            s.bind((pcfg.master_addr, pcfg.master_port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UsageError(f"port {pcfg.master_port} on {pcfg.master_addr} is in use; "
                                 "choose another with --master-port") from None
            # Not an address of this machine: torchrun will reach it, or say why.


# -- the single-device measurement ------------------------------------------------------------------

def measure_single(work: Workload, run: RunConfig, spec: StepSpec, pcfg: ParallelConfig, threads: int,
                   run_dir: Path, progress: Progress) -> SingleProcess:
    """k = 1, through the same torchrun worker path as the job (DDP-wrapped, the same threads per process):
    the t_compute every prediction starts from, like with like (docs/measurement.md, rule 6)."""
    out = run_dir / "single.json"
    job = write_job(run_dir, "single", run, spec, pcfg, work.device, threads, single_out=str(out))
    log = run_dir / "single.log"
    progress(f"one process through torchrun{f' with {threads} thread(s)' if work.device.type == 'cpu' else ''}: "
             f"tokens/s of {'+'.join(work.cfg.run.rungs or ())} (the prediction's t_compute)", "single")
    outcome = launch(torchrun_command(pcfg, 1, job, standalone=True), threads, log, progress)
    if outcome.rc != 0 or not out.is_file():
        raise JobFailed(failure_line(outcome, log))
    return from_dict(SingleProcess, json.loads(out.read_text()))


def bucket_sizes(work: Workload, spec: StepSpec, pcfg: ParallelConfig) -> list[int]:
    """The message sizes this job's DDP sends: probed too, so the fit prices them from measurement."""
    section = new_section(work, spec, pcfg, "", [], 1, None)
    return sorted({*section.ddp_buckets, section.first_bucket_bytes, section.bucket_cap_bytes})


def new_parallel_results(work: Workload, spec: StepSpec, pcfg: ParallelConfig, command: str, ks: list[int],
                         threads: int) -> Results:
    saved = new_results(work)
    saved.parallel = new_section(work, spec, pcfg, command, ks, threads,
                                 cpu_cores() if work.device.type == "cpu" else None)
    return saved


# -- torchrun -----------------------------------------------------------------------------------------

def torchrun_command(pcfg: ParallelConfig, nproc: int, job_path: Path, standalone: bool = False) -> list[str]:
    """torchrun with the job's arguments passed through; `standalone`: this node alone, on a free port of its own."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--max-restarts=0",
           f"--monitor-interval={pcfg.monitor_interval_s}"]
    if standalone:
        cmd.append("--standalone")
    elif pcfg.rdzv_endpoint is not None:
        cmd += [f"--nnodes={pcfg.nnodes}", f"--node-rank={pcfg.node_rank}",
                f"--rdzv-endpoint={pcfg.rdzv_endpoint}", f"--rdzv-backend={pcfg.rdzv_backend}"]
        if pcfg.rdzv_id is not None:
            cmd.append(f"--rdzv-id={pcfg.rdzv_id}")
    else:
        cmd += [f"--nnodes={pcfg.nnodes}", f"--node-rank={pcfg.node_rank}", f"--master-addr={pcfg.master_addr}",
                f"--master-port={pcfg.master_port}"]
    return [*cmd, "-m", "speedladder.parallel.rank", str(job_path)]


@dataclasses.dataclass
class Outcome:
    rc: int
    seconds: float
    error: str | None  # the first failing rank's line
    other_errors: int  # ranks that failed after it (usually because it did)
    tail: list[str]  # torchrun's last lines, for a failure no rank explained


def launch(cmd: list[str], threads: int, log_path: Path, progress: Progress) -> Outcome:
    """Run torchrun; pass the ranks' progress lines on, keep everything else in the log."""
    # The workers import the same speedladder as this process, wherever it lives.
    env = subproc.child_env(OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    errors: list[str] = []
    tail: collections.deque[str] = collections.deque(maxlen=20)
    t0 = time.perf_counter()
    with log_path.open("w") as log:
        log.write(" ".join(cmd) + "\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                m = _RANK_LINE.match(line.rstrip("\n"))
                if m is None:
                    if line.strip():
                        tail.append(line.rstrip())
                elif m.group(2):
                    errors.append(f"rank {m.group(1)} failed: {m.group(3)}")
                else:
                    progress(m.group(3), f"rank {m.group(1)}")
            rc = proc.wait()
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGTERM)  # torchrun's own session: it and its workers
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            raise
    return Outcome(rc, time.perf_counter() - t0, errors[0] if errors else None, max(0, len(errors) - 1),
                   list(tail))


_EXCEPTION_LINE = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b:?.*)$")


def failure_line(outcome: Outcome, log_path: Path) -> str:
    """The one line a failed job is told by: the failing rank's own line, else the last exception in the log."""
    if outcome.error:
        others = f"; {outcome.other_errors} other rank(s) stopped after it" if outcome.other_errors else ""
        return f"{outcome.error}{others} (full log: {log_path})"
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        lines = outcome.tail
    # A rank that died before it could say why (an import, the process group): its traceback's last line.
    raised = [m.group(1).strip() for ln in lines if (m := _EXCEPTION_LINE.match(ln))
              and not m.group(1).startswith(("torch.distributed.elastic", "ChildFailedError"))]
    if raised:
        return f"a rank failed: {raised[-1][:300]} (full log: {log_path})"
    last = next((ln for ln in reversed(outcome.tail) if ln.strip().strip("=-") ), "no output")
    return f"torchrun exited with status {outcome.rc}: {last} (full log: {log_path})"


def write_job(run_dir: Path, mode: str, run: RunConfig, spec: StepSpec, pcfg: ParallelConfig, device: torch.device,
              threads: int, **extra) -> Path:
    job = {"mode": mode, "run": to_data(run), "spec": spec.to_dict(), "strategy": pcfg.strategy,
           "parallel_config": dataclasses.asdict(pcfg), "device_type": device.type, "threads": threads,
           "run_dir": str(run_dir), **extra}
    path = run_dir / (JOB_FILE if mode == "train" else "single.job.json" if mode == "single"
                      else f"probe-{extra.get('k')}.job.json")
    path.write_text(json.dumps(job, indent=1))
    return path


# -- the two commands ----------------------------------------------------------------------------------

def _start(run: RunConfig, pcfg: ParallelConfig) -> tuple[Workload, StepSpec]:
    work = prepare(run)  # the ParallelConfig checked its own values when it was made
    spec = chosen_spec(work)
    return work, spec


def _probe(work: Workload, run: RunConfig, spec: StepSpec, pcfg: ParallelConfig, k: int, run_dir: Path,
           progress: Progress) -> Probe:
    threads = threads_per_process(k)
    out = run_dir / f"probe-{k}.json"
    job = write_job(run_dir, "probe", run, spec, pcfg, work.device, threads, k=k, probe_out=str(out),
                    probe_sizes=bucket_sizes(work, spec, pcfg))
    log = run_dir / f"probe-{k}.log"
    progress(f"allreduce probe over {k} processes (torchrun, "
             f"{'nccl' if work.device.type == 'cuda' else 'gloo'})", "bandwidth")
    outcome = launch(torchrun_command(pcfg, k, job), threads, log, progress)
    if outcome.rc != 0 or not out.is_file():
        raise JobFailed(failure_line(outcome, log))
    return from_dict(Probe, json.loads(out.read_text()))


class JobFailed(Exception):
    """A torchrun job that failed: shown as one line, exit status 1."""


def run_predict(run: RunConfig, pcfg: ParallelConfig, progress: Progress) -> Path:
    """Price pcfg.predict_nproc; the bandwidth given, measured (--measure-bandwidth) or from a datasheet."""
    ks, bandwidth_gbps, latency_us = list(pcfg.predict_nproc), pcfg.bandwidth_gbps, pcfg.latency_us
    measure_bandwidth = pcfg.measure_bandwidth
    work, spec = _start(run, pcfg)
    check_nproc(1, work.device)  # k = 1 is measured through torchrun as well
    for k in ks:
        if measure_bandwidth:
            check_nproc(k, work.device, "--nprocs")
    datasheet = None
    if bandwidth_gbps is None and not measure_bandwidth:
        name = storage.device_name(work.device)
        datasheet = costmodel.datasheet_busbw_gbps(name) if work.device.type == "cuda" else None
        if datasheet is None:
            raise UsageError(f"no bandwidth known for {name}: give --bandwidth GBps (bus bandwidth) "
                             "or --measure-bandwidth")
    if measure_bandwidth:
        check_port(pcfg)
    threads = threads_per_process(max(ks))
    run_dir = storage.new_run_dir(run.out)
    saved = new_parallel_results(work, spec, pcfg, "predict", ks, threads)
    section = saved.parallel
    assert section is not None  # new_parallel_results made it
    storage.save(saved, run_dir)
    if measure_bandwidth:
        section.probes = [_probe(work, run, spec, pcfg, k, run_dir, progress) for k in ks if k > 1]
        last = section.probes[-1] if section.probes else None
        section.bandwidth = Bandwidth(source="measured", busbw_GBps=last.busbw_GBps if last else None,
                                      latency_us=last.latency_us if last else None, probe_k=last.k if last else None,
                                      note="allreduce probe over the process group of each k (torchrun)")
    elif bandwidth_gbps is not None:
        lat = latency_us if latency_us is not None else pcfg.assumed_latency_us
        section.bandwidth = Bandwidth(source="given", busbw_GBps=bandwidth_gbps, latency_us=lat,
                                      note="bus bandwidth from --bandwidth; latency "
                                           + ("from --latency-us" if latency_us is not None else
                                              f"assumed {lat:g} µs (not measured)"))
    else:
        lat = latency_us if latency_us is not None else pcfg.assumed_latency_us
        section.bandwidth = Bandwidth(source="datasheet", busbw_GBps=datasheet, latency_us=lat,
                                      note=f"ASSUMED, not measured: NVIDIA's datasheet NVLink bandwidth per direction "
                                           f"for {storage.device_name(work.device)} ({datasheet:g} GB/s), the "
                                           f"ceiling a ring's busbw approaches; latency assumed {lat:g} µs")
    storage.save(saved, run_dir)
    section.single = measure_single(work, run, spec, pcfg, threads, run_dir, progress)
    if section.bandwidth.busbw_GBps is None:  # only k=1 asked for
        section.predictions = [single_prediction(section)]
    else:
        section.predictions = price(section, sorted({1, *ks}))
    saved.status = "complete"
    storage.save(saved, run_dir)
    return run_dir


def run_ddp(run: RunConfig, pcfg: ParallelConfig, progress: Progress) -> Path | None:
    """The job's run folder, or None on a node whose ranks finished but where rank 0 did not run."""
    k = pcfg.nproc
    work, spec = _start(run, pcfg)
    check_nproc(k, work.device)
    check_port(pcfg)
    threads = threads_per_process(k)
    run_dir = storage.new_run_dir(run.out)
    saved = new_parallel_results(work, spec, pcfg, "ddp", [k], threads)
    assert saved.parallel is not None  # new_parallel_results made it
    storage.save(saved, run_dir)
    saved.parallel.single = measure_single(work, run, spec, pcfg, threads, run_dir, progress)
    storage.save(saved, run_dir)
    job = write_job(run_dir, "train", run, spec, pcfg, work.device, threads,
                    probe_sizes=bucket_sizes(work, spec, pcfg))
    log = run_dir / LOG_FILE
    progress(f"launching {k} process(es) per node with torchrun ({pcfg.strategy}, "
             f"{'nccl' if work.device.type == 'cuda' else 'gloo'}); log: {log}", "launch")
    cmd = torchrun_command(pcfg, k, job)
    outcome = launch(cmd, threads, log, progress)
    if outcome.rc != 0:
        line = failure_line(outcome, log)
        saved = storage.load(run_dir)
        saved.status, saved.error = "failed", line
        storage.save(saved, run_dir)
        raise JobFailed(line)
    saved = storage.load(run_dir)
    if saved.parallel is None or saved.parallel.measured is None:  # rank 0 ran on another node, wrote there
        saved.status, saved.detail = "elsewhere", "rank 0 ran on another node: the job's results are in its run folder"
        storage.save(saved, run_dir)
        return None
    saved.parallel.launch = {"command": cmd, "seconds": outcome.seconds, "log": str(log)}
    storage.save(saved, run_dir)
    return run_dir
