"""A failed gate explains itself: where the difference from float64 begins (docs/measurement.md, rule 12; the
`bisection` refinement).

A gate says that a rung's gradient of wpe.weight is 8e-4 from fp64; a user wants to know which part of the model
made it so. This is the "bisect to the op at fault" that one does by hand with per-module activations (torchtitan's
numerics debugging) or with dynamo's minifier: here it runs by itself when a gate fails.

- The float64 model, eager at the rung's precision (emulated, emulated_precision.py) and the rung's own model
  (uncompiled, with its transforms and autocast) each run one forward and backward at the failing check's weights,
  on its probe batch, with hooks on every module's output: the output, and the gradient that arrives at it.
- A module leaves the rounding band where its output's (or its input gradient's) distance from fp64 exceeds
  k x eager's there + the precision's floor, the gates' own rule (tolerance.py). The first in forward order is
  named; if no output leaves, the first in backward order whose output's gradient does. Module names are matched
  with the plain model's (a wrapper such as checkpointing's `block` is looked through).
- A compiled rung whose uncompiled model stays in the band everywhere is said to diverge inside torch.compile.
- For a causality failure: the first module whose output at the positions before the change moves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from speedladder.records import Distance, Explanation, Fp64, Gate
from speedladder.step.train_step import TrainStep, matmul_precision
from speedladder.verify import probes
from speedladder.verify.distance import errors, judge
from speedladder.verify.emulated_precision import Arithmetic
from speedladder.verify.reference import Reference
from speedladder.verify.tolerance import TOLERANCES

Batch = tuple[torch.Tensor, torch.Tensor]
Context = AbstractContextManager[Any]
# At most this many elements of a module's output are kept per run (the first sequences'): enough to see where a
# difference begins, bounded for a big model.
KEEP = 1 << 20


def _first(out: Any) -> torch.Tensor | None:
    """The first floating tensor of a module's output (a tensor, a tuple, a Hugging Face ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return out if out.is_floating_point() else None
    if isinstance(out, (tuple, list)):
        return next((t for t in map(_first, out) if t is not None), None)
    if isinstance(out, dict):
        return next((t for t in map(_first, out.values()) if t is not None), None)
    return None


def _kept(t: torch.Tensor) -> torch.Tensor:
    """The first whole sequences of an output laid out batch first (as many as KEEP elements hold), else its
    first KEEP elements; on the host in float64."""
    t = t.detach()
    if t.dim() >= 2 and t.numel() > KEEP:
        t = t[:max(1, KEEP // (t.numel() // t.shape[0]))]
    if t.numel() > KEEP:
        t = t.reshape(-1)[:KEEP]
    return t.double().cpu()


@dataclass
class Trace:
    """One run's module outputs and the gradients that arrived at them, by module name (a second call: name#2), in
    the order they came."""

    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    grads: dict[str, torch.Tensor] = field(default_factory=dict)


@contextmanager
def _hooked(model: nn.Module, trace: Trace, backward: bool = True) -> Iterator[None]:
    """Each module's first floating output kept as it is made, and (`backward`) the gradient that arrives at it, by a
    hook on the output tensor itself: no module backward hook, which in-place ops and tuple outputs refuse."""
    calls: dict[str, int] = {}
    back: dict[str, int] = {}
    handles = []

    def key(name: str, seen: dict[str, int]) -> str:
        seen[name] = seen.get(name, 0) + 1
        return name if seen[name] == 1 else f"{name}#{seen[name]}"

    def keep_grad(name: str) -> Callable[[torch.Tensor], None]:
        def keep(g: torch.Tensor) -> None:
            trace.grads[key(name, back)] = _kept(g)
        return keep

    for name, module in model.named_modules():
        if not name:
            continue

        def fwd(_m: nn.Module, _args: Any, out: Any, name: str = name) -> None:
            t = _first(out)
            if t is not None:
                trace.outputs[key(name, calls)] = _kept(t)
                if backward and t.requires_grad:
                    t.register_hook(keep_grad(name))

        handles.append(module.register_forward_hook(fwd))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def trace(step: TrainStep, weights: dict[str, torch.Tensor], batch: Batch,
          arithmetic: Context | None = None) -> Trace:
    """One uncompiled forward and backward of the step (its transforms and autocast) at the weights, hooked."""
    step.reset(weights)
    x, y = (t.to(step.device) for t in batch)
    out = Trace()
    with arithmetic or nullcontext(), _hooked(step.model, out):
        step.forward_backward(x, y, compiled=False)
    return out


def _rel(a: torch.Tensor, truth: torch.Tensor) -> float:
    if a.shape != truth.shape:
        return math.inf
    scale = float(truth.norm())
    diff = float((a - truth).norm())
    return diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)


def _plain(name: str, known: dict[str, torch.Tensor]) -> str | None:
    """A rung's module name as the plain model names it: as is, or with a wrapper's segment left out."""
    if name in known:
        return name
    base, _, call = name.partition("#")
    parts = base.split(".")
    for i in range(len(parts)):
        candidate = ".".join(parts[:i] + parts[i + 1:]) + (f"#{call}" if call else "")
        if candidate in known:
            return candidate
    return None


@dataclass
class Divergence:
    """The first module whose output or input gradient leaves the rounding band."""

    module: str
    where: str  # "output" or "output's gradient"
    rung: float
    eager: float
    allowed: float


def first_leaving(rung: Trace, eager: Trace, truth: Trace, precision: str) -> Divergence | None:
    """The first module in forward order whose output leaves k x eager's distance + the floor; else the first in
    backward order whose output's gradient does; None when every module stays in the band."""
    tol = TOLERANCES[precision]
    for where, mine, theirs, true in (("output", rung.outputs, eager.outputs, truth.outputs),
                                      ("output's gradient", rung.grads, eager.grads, truth.grads)):
        for name, t in mine.items():
            plain = _plain(name, true)
            if plain is None or plain not in theirs:
                continue
            r, e = _rel(t, true[plain]), _rel(theirs[plain], true[plain])
            allowed = tol.k * e + tol.floor
            if not r <= allowed:
                return Divergence(plain, where, r, e, allowed)
    return None


def first_leak(step: TrainStep, weights: dict[str, torch.Tensor], batch: Batch, position: int) -> str | None:
    """The first module (forward order) whose output at positions up to `position` moves when the tokens after it
    change, beyond its own run-to-run difference; None if none does or no output is laid out by position."""
    x, y = batch
    changed = x.clone()
    changed[:, position + 1:] = (changed[:, position + 1:] + 1) % step.vocab_size
    runs = []
    for tokens in (x, x, changed):
        t = Trace()
        step.reset(weights)
        with torch.no_grad(), step._autocast, _hooked(step.model, t, backward=False):
            step.eager_forward(tokens.to(step.device), y.to(step.device))
        runs.append(t)
    a, again, b = runs
    for name, out in a.outputs.items():
        if name not in b.outputs or out.dim() < 2 or out.shape[1] != x.shape[1]:
            continue  # only outputs laid out (batch, position, ...) say which positions moved
        noise = float((out - again.outputs[name]).abs().max())
        moved = float((out[:, :position + 1] - b.outputs[name][:, :position + 1]).abs().max())
        if moved > max(4 * noise, 1e-6 * float(out.abs().max())):
            return name
    return None


def _within(d: Distance | None) -> bool:
    return d is None or (d.rung is not None and d.allowed is not None and d.rung <= d.allowed)


def explain(step: TrainStep, ref: Reference, gate: Gate, plain: TrainStep, step64: TrainStep | None,
            emulated: Arithmetic) -> Explanation:
    """Why a gate failed: for causality, the first module whose past moves; for equivalence or the differential
    check, the first module that leaves the rounding band (first_leaving), or the update when only the loss curve
    strays; and whether a second probe fails too. `plain` is eager fp32 with the rung's architecture, `emulated`
    its arithmetic at the rung's precision."""
    spec = step.spec
    causal = gate.causality
    if causal is not None and not causal.passed and causal.position is not None:
        module = first_leak(step, ref.probe_weights, ref.batch, causal.position)
        return Explanation(check="causality", module=module, where="past positions", summary=(
            f"the logits before position {causal.position} move when later tokens change; the first module "
            f"whose output there moves is {module}" if module else
            "the past moves at the logits, but no module's output laid out by position shows where first"))
    numeric = [c for c in (gate.equivalence, gate.differential)
               if c is not None and not c.passed and c.fp64 is not None]
    update = ("the outputs and gradients at fixed weights stay within rounding while the loss curve strays: the "
              "update itself differs (the optimizer, or what it is given)")
    if not numeric or step64 is None:
        band = gate.loss_band
        failed_band = band is not None and not band.passed
        return Explanation(check="loss band" if failed_band else "",
                           summary=update if failed_band else "no module-level explanation for this check")
    check = numeric[0]
    name = "equivalence" if check is gate.equivalence else "differential"
    f = check.fp64
    assert f is not None
    if f.curve is not None and all(_within(d) for d in (f.logits, f.loss, f.grad)):
        return Explanation(check=name, summary=update)
    weights = ref.weights if name == "equivalence" else ref.probe_weights
    with matmul_precision(plain.spec):
        truth_trace = trace(step64, weights, ref.batch)
        eager_trace = trace(plain, weights, ref.batch, emulated())
    with matmul_precision(spec):
        mine = trace(step, weights, ref.batch)
    leaving = first_leaving(mine, eager_trace, truth_trace, spec.precision)
    out = Explanation(check=name)
    if leaving is not None:
        out.module, out.where = leaving.module, leaving.where
        out.rung, out.eager, out.allowed = leaving.rung, leaving.eager, leaving.allowed
        head = (f"the divergence starts at {leaving.module}'s {leaving.where} ({leaving.rung:.2e} from fp64, "
                f"allowed {leaving.allowed:.2e}: eager's {leaving.eager:.2e})")
    elif spec.compile:
        out.compiled = True
        head = ("the uncompiled model with the same transforms stays within rounding at every module: the "
                "divergence is in torch.compile's code (TORCHDYNAMO_REPRO_AFTER=aot narrows it to a graph)")
    else:
        worst = f.grad.name if f.grad is not None else "a parameter"
        head = (f"every module's output and input gradient stays within rounding: the fault is in the gradient "
                f"of {worst} itself, after the backward through the modules")
    out.kind, out.second_probe = second_probe(step, plain, step64, emulated, ref, weights, f)
    tail = {"function": "it fails at a second probe too: a change of function",
            "kink": "it passes at a second probe: it looks like a flip at a kink",
            "probe": "it passes at a second probe: the failure depends on where it is probed"}.get(out.kind, "")
    out.summary = head + (f"; {tail}" if tail else "")
    return out


def second_probe(step: TrainStep, plain: TrainStep, step64: TrainStep, emulated: Arithmetic,
                 ref: Reference, weights: dict[str, torch.Tensor], first: Fp64) -> tuple[str, str]:
    """The same outputs judged at the last gate batch: a wrong function is wrong there too; a flip at a kink
    happens at one probe. ("function" | "kink" | "probe", what it showed.)"""
    batch, rows = ref.batches[-1], ref.probe_rows
    with matmul_precision(plain.spec):
        truth64 = probes.outputs(step64, weights, batch, rows, keep=torch.float64)
        with emulated():
            eager = probes.outputs(plain, weights, batch, rows)
    with matmul_precision(step.spec):
        mine = probes.outputs(step, weights, batch, rows)
    precision = step.spec.precision
    judged = judge(errors(mine, truth64), ("eager", errors(eager, truth64)), None, precision, TOLERANCES[precision])
    where = f"gate batch {len(ref.batches) - 1}, the same weights"
    if not judged.passed:
        return "function", f"{where}: fails too ({judged.detail})"
    near = first.kinks.near if first.kinks is not None else 0
    return ("kink" if near else "probe"), f"{where}: passes"
