"""The referee's side of a worker: the process, stopped whenever it is off the clock, the weights it shares, and a
step that a race trains as it trains its own (racing.runs.Stepper).

A worker runs only while the referee waits on one of its answers: after each answer the whole process group is
stopped (SIGSTOP), and continued (SIGCONT) for the next request. So nothing of the side's runs while the clock is
stopped, while the other side trains, or while the referee evaluates.

The weights cross in a file-backed buffer of float32 values (on /dev/shm where there is one) laid out by the
referee from its own model's parameters: the worker writes its trained weights there at the end of a stretch that
reaches an evaluation, and reads a run's initial weights from there; the referee evaluates what it reads there in
its own eager fp32 model, on its own val set.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from speedladder import subproc
from speedladder.data import asset
from speedladder.judge.wire import WireError, read_answer, send_request
from speedladder.judge.worker import Hello, Layout
from speedladder.measure import machine_load
from speedladder.racing import Race
from speedladder.racing.runs import RunInProgress, Stepper
from speedladder.spec import StepSpec
from speedladder.step.train_step import TrainStep, matmul_precision
from speedladder.step.workload import Workload

MODULE = "speedladder.judge.worker"
SHM = Path("/dev/shm")
# glibc's allocator, fixed alike in both workers. By default it raises its mmap threshold each time a large block is
# freed, so a worker that freed big tensors before the race (the candidate's, after its gates) then serves every
# step from its heap, while the other maps and faults in fresh pages each step: on d2l-cpu the candidate of a no-op
# ran 3% faster in 5 judgements of 5; with the thresholds fixed, 0.99-1.00x in 5 of 5 (docs/judge.md#measured).
ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}
STOP_WAIT_S = 1.0  # a stop is delivered within microseconds; past this the worker is taken as stopped anyway


class SideFailed(RuntimeError):
    """A worker answered with an error: the side's own code raised (or found bad input: `usage`), with what its
    guard saw meanwhile."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__(str(answer.get("error") or "failed"))
        self.usage = bool(answer.get("usage"))
        self.problems = [str(p) for p in answer.get("problems") or []]


class Buffer:
    """A side's weights, shared with its worker: a float32 file mapped by both, laid out by parameter name."""

    def __init__(self, params: Mapping[str, torch.Tensor]) -> None:
        self.layout: Layout = []
        offset = 0
        for name, p in params.items():
            self.layout.append((name, tuple(p.shape), offset))
            offset += p.numel()
        fd, path = tempfile.mkstemp(prefix="speedladder-judge-", suffix=".f32", dir=SHM if SHM.is_dir() else None)
        os.ftruncate(fd, offset * 4)
        os.close(fd)
        self.path = path
        self.flat = torch.from_file(path, shared=True, size=offset, dtype=torch.float32)

    def views(self) -> dict[str, torch.Tensor]:
        return {name: self.flat[o:o + _numel(shape)].view(shape) for name, shape, o in self.layout}

    def write(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, view in self.views().items():
                view.copy_(weights[name])

    def close(self) -> None:
        """The file unlinked: the memory stays mapped in every process that mapped it, until it ends."""
        Path(self.path).unlink(missing_ok=True)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class Evaluator:
    """The referee's evaluation: eager fp32 in this process, the weights read from a side's buffer, on the val set."""

    def __init__(self, work: Workload) -> None:
        self.step: TrainStep = work.step(work.base_spec)

    def evaluate(self, weights: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                 chunk: int) -> torch.Tensor:
        with torch.no_grad():
            for name, p in self.step.params.items():
                p.copy_(weights[name])
        with matmul_precision(self.step.spec):  # fp32 whatever the side trains in: never the side's precision
            return self.step.evaluate(x, y, chunk)


class Worker:
    """One worker process, seen from the referee: requests in, JSON answers out, stopped between them."""

    def __init__(self, name: str, hello: Hello, timeout_s: float, quiet: bool) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.proc = subproc.start(MODULE, **{k: os.environ.get(k, v) for k, v in ALLOCATOR.items()})
        self.pgid = os.getpgid(self.proc.pid)
        self.lines: collections.deque[str] = collections.deque(maxlen=20)
        self._reader = threading.Thread(target=self._forward, args=(quiet,), daemon=True)
        self._reader.start()
        self.stopped = False
        self.said_bye = False
        self._send(hello)

    def _forward(self, quiet: bool) -> None:
        """The worker's stderr (its progress, and whatever the side prints) onto ours, its last lines kept."""
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            self.lines.append(line)
            if not quiet:
                print(f"  [{self.name}] {line}", file=sys.stderr, flush=True)

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass

    def _send(self, request: object) -> None:
        assert self.proc.stdin is not None
        try:
            send_request(self.proc.stdin, request)
        except BrokenPipeError:
            raise WireError(f"the {self.name} worker exited{self._last_line()}") from None

    def _last_line(self) -> str:
        return f" ({self.lines[-1]})" if self.lines else ""

    def answer(self) -> dict[str, Any]:
        """The next answer (the worker running meanwhile), then the worker stopped; SideFailed for an error."""
        assert self.proc.stdout is not None
        try:
            got = read_answer(self.proc.stdout.fileno(), self.timeout_s, f"the {self.name} worker")
        except WireError as e:
            raise WireError(f"{e}{self._last_line()}") from None
        finally:
            self.stop()
        if "error" in got:
            raise SideFailed(got)
        return got

    def stop(self) -> None:
        """The process group stopped, and the worker seen stopped (Linux: its state in /proc) before this returns."""
        self._signal(signal.SIGSTOP)
        self.stopped = True
        stat = Path(f"/proc/{self.proc.pid}/stat")
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            try:
                text = stat.read_text()
            except OSError:  # not Linux, or it ended
                return
            if text[text.rindex(")") + 2] in "TtZX":
                return
            time.sleep(0.0002)

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """One request and its answer: the worker continued for it, stopped after it."""
        self._signal(signal.SIGCONT)
        self.stopped = False
        self._send({"op": op, **fields})
        return self.answer()

    def cpu_seconds(self) -> float:
        """The CPU seconds the worker's process group has used so far (Linux; 0 elsewhere)."""
        total = 0.0
        tick = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
        for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
            if not entry.name.isdigit():
                continue
            try:
                text = (entry / "stat").read_text()
            except OSError:
                continue
            rest = text[text.rindex(")") + 2:].split()
            if int(rest[2]) == self.pgid:  # the process group: the worker and what it started
                total += (int(rest[11]) + int(rest[12])) * tick
        return total

    def bye(self) -> None:
        """Asked to end (close waits for it): continued, told, not waited for."""
        self._signal(signal.SIGCONT)
        with contextlib.suppress(Exception):  # close ends it whatever happens here
            if self.proc.poll() is None and not self.said_bye:
                self.said_bye = True
                self._send({"op": "bye"})

    def close(self) -> None:
        """The worker ended: asked to, then killed if it has not ended within 10 s."""
        self.bye()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=10)
        self._signal(signal.SIGKILL)
        self.proc.wait()


class RemoteStep:
    """A side's step as a race sees it (racing.runs.Stepper): reset writes the initial weights to the buffer, a
    stretch of steps is one request, evaluation is the referee's own, on what the worker last wrote."""

    def __init__(self, worker: Worker, spec: StepSpec, buffer: Buffer, evaluator: Evaluator,
                 init: dict[str, torch.Tensor]) -> None:
        self.worker, self._spec, self.buffer, self.evaluator, self.init = worker, spec, buffer, evaluator, init
        self._reset = True

    @property
    def spec(self) -> StepSpec:
        return self._spec

    def reset(self, weights: dict[str, torch.Tensor] | None = None, updates: int = 0) -> None:
        """The next stretch starts from these weights (the initial ones by default), with a fresh optimizer."""
        self.buffer.write(self.init if weights is None else weights)
        self._reset = True

    def train(self, batches: list[tuple[torch.Tensor, torch.Tensor]], export: bool) -> float:
        """A stretch of steps in the worker: the batches sent, the loss of the last step back (NaN if not finite)."""
        x = torch.stack([b[0].cpu() for b in batches])
        y = torch.stack([b[1].cpu() for b in batches])
        answer = self.worker.request("train", x=x, y=y, reset=self._reset, export=export)
        self._reset = False
        loss = answer.get("loss")
        return float(loss) if isinstance(loss, (int, float)) else float("nan")

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.tensor(self.train([(x, y)], export=True))

    def evaluate(self, x: torch.Tensor, y: torch.Tensor, chunk: int) -> torch.Tensor:
        return self.evaluator.evaluate(self.buffer.views(), x, y, chunk)


class WorkerMeter(machine_load.Meter):
    """The machine's load as a race reads it, with the workers' CPU counted as ours, not as a neighbour's."""

    def __init__(self, meter: machine_load.Meter, workers: list[Worker]) -> None:
        super().__init__(meter.root, meter.cpus, meter.tick_s)
        self.workers = workers

    def read(self) -> machine_load.Reading:
        r = super().read()
        return dataclasses.replace(r, own_s=r.own_s + sum(w.cpu_seconds() for w in self.workers))

    def snapshot(self) -> machine_load.Snapshot:
        reading, others = super().snapshot()
        ours = {w.proc.pid for w in self.workers}
        return reading, {pid: v for pid, v in others.items() if pid not in ours}


def copy_tokens(tokens: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
    """The training split as a copy of its own: a slice would carry the whole corpus's storage, val split and all."""
    return tokens.clone() if isinstance(tokens, torch.Tensor) else np.array(tokens)


class JudgeRace(Race):
    """A race whose sides live in worker processes: batches drawn on the host and sent a stretch at a time, no
    warm step off the clock, the target set on the base."""

    base_step: Stepper | None = None

    def _warm(self, step: Stepper, init: dict[str, torch.Tensor]) -> float:
        return 0.0 if isinstance(step, RemoteStep) else super()._warm(step, init)

    def _stream(self, step: Stepper, seed: int) -> Any:
        return self.work.stream(step.spec, seed=seed, device=torch.device("cpu"))

    def _steps(self, g: RunInProgress, n: int) -> torch.Tensor | float:
        if not isinstance(g.step, RemoteStep):
            return super()._steps(g, n)
        tps = g.step.spec.tokens_per_step
        export = g.tokens + n * tps >= g.next_eval or (g.max_steps is not None and g.steps + n >= g.max_steps)
        return g.step.train([next(g.stream) for _ in range(n)], export)

    def _eager_step(self) -> Stepper:
        return self.base_step if self.base_step is not None else super()._eager_step()


def protected_paths(work: Workload) -> list[str]:
    """What a worker may not open: the embedded corpora, the data and val files, this process under /proc."""
    paths = [str(asset()), f"/proc/{os.getpid()}"]
    for p in (work.cfg.data, work.cfg.run.val_data):
        if p and Path(p).exists():
            paths.append(str(Path(p).resolve()))
    return paths
