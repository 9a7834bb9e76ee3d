"""A judge's worker: the one process where a side's code runs (`python -m speedladder.judge.worker`).

It holds the side's training step and nothing the referee judges by: no val split (only a copy of the training
split, for the gates' batches), no clock the referee reads, no evaluation. Its lifetime, one request at a time:

1. hello: the workload made from the training split alone; the guard installed (guard.py); the side's rung files
   imported and its rungs composed on eager fp32; the step built. Answers what it built, or why not.
2. warm: the step warmed up (compiled, where it compiles) off the clock, then reset.
3. gate (the candidate's): the two probes of gaming.py, then the gates (gating.py).
4. train: n steps on the batches sent, from the weights the referee wrote when told to reset, the weights written
   back after the last when told to export. The referee times this request, and stops the whole process group
   between requests: nothing runs here off its clock.
5. check: what the guard found so far.

Answers are JSON on a descriptor of their own; the process's stdout is its stderr, so that nothing a candidate
prints can pass for an answer.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from speedladder import codec
from speedladder.config.resolved import resolve
from speedladder.config.run import RunConfig
from speedladder.data.corpus import Corpus, Split
from speedladder.errors import UsageError, one_line
from speedladder.judge import gaming, gating, wire
from speedladder.judge.guard import DATA_REFUSED, Guard, watched_call
from speedladder.measure import devicemem, timer
from speedladder.progress import show_on_stderr
from speedladder.records import to_dict
from speedladder.rungs import RUNGS, architecture, compose, env_for
from speedladder.rungs import files as rung_files
from speedladder.step import workload
from speedladder.step.schedule import Schedule
from speedladder.step.train_step import matmul_precision
from speedladder.step.workload import Workload

Layout = list[tuple[str, tuple[int, ...], int]]  # (parameter, shape, offset in floats) in the shared buffer


@dataclass
class Hello:
    """What a worker is told first: its side, the workload's parts, and where the weights cross."""

    run: RunConfig  # the side's run: its rungs (composed on eager), rung files, learning rate, recipe, Muon
    declared_from: tuple[str, ...]  # rung files whose declared rungs follow run.rungs, in order
    vocab: int | None
    device: str
    train: Corpus  # a copy of the training split: never a view of the whole corpus
    schedule: Schedule
    buffer: str
    layout: Layout
    protected: list[str]  # paths the guard refuses to open: the corpus, the val file, the referee's /proc
    gate: bool  # the candidate's worker gates its step; the base's does not
    quiet: bool


class UsageAnswer(Exception):
    """Bad input found here (a file that declares no rung, a rung that cannot run here): exit 2 at the referee."""


def _die_with_parent() -> None:
    """Linux: killed with the referee, even while stopped (SIGKILL ends a stopped process)."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass


class Worker:
    """One side's step, built from a Hello; handle() answers each later request."""

    last_guard: Guard | None = None  # set before the side's files are imported: a failure there is still watched

    def __init__(self, hello: Hello) -> None:
        self.hello = hello
        self.progress = show_on_stderr(hello.quiet)
        run = hello.run
        if run.threads is not None:
            torch.set_num_threads(run.threads)
        device = torch.device(hello.device)
        plain = dataclasses.replace(run.with_rungs(("eager",)), rung_files=(), rung_hashes=None)
        cfg, model, init = workload.define_model(resolve(plain, device, known_rungs=tuple(RUNGS)), hello.vocab)
        split = Split(hello.train, dataclasses.replace(hello.train, tokens=hello.train.tokens[:0]),
                      "held by the referee")
        env = env_for(device, cfg.batch_multiplier, cfg.run.batch_lr_scale, model, base_batch=cfg.batch_size,
                      accum_steps=cfg.run.recipe.accum_steps)
        self.work = Workload(cfg, device, hello.train, init, env, model, split, schedule=hello.schedule)
        self.guard = Worker.last_guard = Guard(hello.protected)  # before any of the side's own code is imported
        self.names = self._load(run)
        self.spec = compose(self.names, self.work.base_spec, env)
        unmet = next((why for n in self.names if (why := RUNGS[n].requires.unmet(env))), None)
        if unmet or (unmet := self.work.unfit(self.spec)):
            raise UsageAnswer(f"it cannot run here: {unmet}")
        if architecture(self.spec):
            raise UsageAnswer(f"{'+'.join(architecture(self.spec))} changes the model's function on purpose: the "
                              "judge evaluates every side with eager fp32's function; race it (speedladder race)")
        self.step = self.work.step(self.spec)
        if self.step.added:
            raise UsageAnswer(f"its model transform makes new parameters ({', '.join(self.step.added)}), which the "
                              "judge's evaluation would not have")
        self.flat = torch.from_file(hello.buffer, shared=True, size=sum(_numel(s) for _, s, _ in hello.layout),
                                    dtype=torch.float32)

    def _load(self, run: RunConfig) -> tuple[str, ...]:
        """The side's rung files imported (under the guard), and the rungs it composes, in order."""
        rung_files.load(tuple(f for f in run.rung_files if f not in self.hello.declared_from), run.rung_hashes)
        names = [n for n in run.rungs or () if n != "eager"]
        for entry in self.hello.declared_from:
            names += rung_files.load((entry,), run.rung_hashes)
        unknown = [n for n in names if n not in RUNGS]
        if unknown:
            raise UsageAnswer(f"unknown rung {unknown[0]!r}")
        return tuple(names)

    @property
    def meta(self) -> dict[str, Any]:
        return {"spec": codec.to_data(self.spec, json=True), "rungs": list(self.names),
                "kinds": {n: RUNGS[n].kind for n in self.names}, "reasons": {n: RUNGS[n].reason for n in self.names},
                "sources": {n: RUNGS[n].source for n in self.names}}

    def _view(self, offset: int, shape: tuple[int, ...]) -> torch.Tensor:
        return self.flat[offset:offset + _numel(shape)].view(shape)

    def warm(self) -> dict[str, Any]:
        """Warm up off the clock (the first step compiles, where it does), then back to the initial weights."""
        w = self.work
        started = time.perf_counter()
        with matmul_precision(self.spec):
            timing = timer.warm_up(timer.stepper(self.step, w.stream(self.spec)), w.device, w.cfg.warmup,
                                   w.cfg.run.timing.max_warmup)
        steady = [s for s, c in zip(timing.warmup_step_s, timing.warmup_compiled) if not c]
        compile_s = (timer.compile_seconds(timing, statistics.median(steady))
                     if self.spec.compile and steady else None)
        self.step.reset()
        return {"warmup_s": time.perf_counter() - started, "compile_s": compile_s}

    def gate(self) -> dict[str, Any]:
        """The gaming probes, then every gate that applies (the gates are not run when a probe found something)."""
        w = self.work
        a, b = w.gate_batches(self.spec, 2)
        device = w.device
        a = (a[0].to(device), a[1].to(device))
        b = (b[0].to(device), b[1].to(device))
        plain = w.step(w.base_spec) if (self.spec.batch_size, self.spec.seq_len) == (
            w.base_spec.batch_size, w.base_spec.seq_len) else w.step(dataclasses.replace(
                w.base_spec, batch_size=self.spec.batch_size, seq_len=self.spec.seq_len))
        found = [f for f in (gaming.stale_outputs(self.step, plain, a, b), gaming.eval_differs(self.step, *a)) if f]
        if found:
            return {"gaming": found, "gate": None}
        record = gating.gate(w, self.step, self.progress, self.progress.scoped("gates"))
        self.step.reset()
        return {"gaming": [], "gate": to_dict(record)}

    def train(self, request: dict[str, Any]) -> dict[str, Any]:
        """n steps on the batches sent; the weights read from the buffer first (reset), written to it after (export)."""
        step, device = self.step, self.work.device
        if request["reset"]:
            step.reset({name: self._view(offset, shape) for name, shape, offset in self.hello.layout})
        xs, ys = request["x"], request["y"]
        loss = torch.zeros(())
        with matmul_precision(self.spec):
            for x, y in zip(xs, ys):
                loss = step(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
        devicemem.sync(device)
        if request["export"]:
            with torch.no_grad():
                for name, shape, offset in self.hello.layout:
                    self._view(offset, shape).copy_(step.reference_part(name, step.params[name]).detach())
        value = float(loss)
        return {"loss": value if math.isfinite(value) else None}

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        if op == "train":
            return self.train(request)
        if op == "warm":
            return self.warm()
        if op == "gate":
            return self.gate()
        if op == "check":
            return {"problems": watched_call(self.guard.problems)}
        raise ValueError(f"unknown request {op!r}")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _failure(e: BaseException, guard: Guard | None) -> dict[str, Any]:
    """An answer for a request that raised: bad input, the side's own error, and what the guard saw meanwhile."""
    problems = watched_call(guard.problems) if guard is not None else []
    text = one_line(e) if not isinstance(e, UsageAnswer) else str(e)
    if DATA_REFUSED in text and not problems:
        problems = [f"opened the data ({text.rsplit('/', 1)[-1]})"]
    usage = isinstance(e, UsageAnswer) or (isinstance(e, UsageError) and "raised" not in text)
    return {"error": text, "usage": usage, "problems": problems}


def main(argv: list[str]) -> int:
    _die_with_parent()
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the side's prints land on stderr, never among the answers
    requests = sys.stdin.buffer
    hello = wire.read_request(requests)
    worker: Worker | None = None
    try:
        worker = Worker(hello)
        wire.send_answer(answers, worker.meta)
    except Exception as e:  # noqa: BLE001 -- the side's code or its input: answered, the referee decides
        wire.send_answer(answers, _failure(e, Worker.last_guard))
        return 0
    while (request := wire.read_request(requests)) is not None and request["op"] != "bye":
        try:
            answer = worker.handle(request)
        except Exception as e:  # noqa: BLE001 -- the side's step raised: answered, the referee decides
            answer = _failure(e, worker.guard)
        wire.send_answer(answers, answer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
