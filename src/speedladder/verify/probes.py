"""What the gates run a step on: the probe weights, a step's outputs there (logits, loss, gradients on the host),
and the causality probe (docs/measurement.md, rule 7).

- Probe weights: the reference's trained weights with every matrix scaled by PROBE_AMPLIFY. Near initialization the
  attention scores are close to zero and the softmax is nearly uniform, so a wrong mask or scale barely moves the
  output; scaled weights make attention selective, and a correct transform computes the same function at any
  weights.
- Causality: change the tokens after position t; the logits up to t must not move beyond the rung's own noise
  (running the same batch twice) and a floor at its precision (tolerance.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from speedladder.records.checks import Causality, not_applicable
from speedladder.step.train_step import TrainStep
from speedladder.verify.distance import Errors
from speedladder.verify.tolerance import TOLERANCES

PROBE_AMPLIFY = 3.0  # matrices x3: attention scores ~x9, softmax selective (a wrong scale moved gradients ~10x)


@dataclass
class Probe:
    """A step's logits (real vocabulary) and gradients at the probe weights, on the probe batch, on the host."""

    logits: torch.Tensor  # (rows, T, V)
    grads: dict[str, torch.Tensor]
    curve: list[float] | None = None  # the step's training loss over the gate batches, when it has one
    precision: str = "fp32"
    shape: tuple[int, int] = (0, 0)
    loss: float = math.nan
    # Its distances from the truth at the trained and at the probe weights (distance.py), once judged: the scale a
    # rung built on it may use.
    errors: tuple[Errors, Errors] | None = None
    # Eager fp32's own at its shape (the reference, or a batch rung on eager): its distances are the reference's at
    # that shape, filled in when a rung built on it is judged there.
    eager: bool = False


def amplified(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The probe weights: every matrix (and embedding table) scaled; vectors (biases, norms) kept."""
    return {n: w * PROBE_AMPLIFY if w.ndim >= 2 else w for n, w in weights.items()}


def accumulate(step: TrainStep, x: torch.Tensor, y: torch.Tensor, micro: int | None,
               rows: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    """One forward and backward of a batch over equal micro-batches of `micro` sequences, gradients left in
    .grad; the logits of its first `rows` sequences (None from a model that returns a loss only) and its loss.

    Each micro-batch's mean loss is backpropagated and the summed gradients divided by their count: with equal
    micro-batches that is the gradient of the whole batch's mean loss, and the loss is the mean of theirs. Only
    one micro-batch's activations and logits are alive at a time: how the eager fp32 reference at a big batch
    fits where the baseline fits. micro None (or the whole batch): one forward and backward.
    """
    if micro is None or micro >= x.shape[0]:
        # The step's own micro-steps when it accumulates, their logits kept for the first `rows` sequences only.
        logits, loss = (step.forward_backward(x, y, rows=rows) if step.spec.accum > 1 else
                        step.forward_backward(x, y))
        return (None if logits is None else logits[:rows]), loss
    if x.shape[0] % micro:
        raise ValueError(f"a batch of {x.shape[0]} does not split into micro-batches of {micro}")
    kept: list[torch.Tensor] = []
    total = torch.zeros((), device=x.device)
    for xs, ys in zip(x.split(micro), y.split(micro)):
        logits, loss = step.forward_backward(xs, ys)
        need = rows - sum(k.shape[0] for k in kept)
        if logits is not None and need > 0:
            kept.append(logits[:need].detach().clone())  # a copy: the micro-batch's logits are freed
        total += loss.detach().float()
        del logits, loss
    n = x.shape[0] // micro
    for p in step.params.values():
        if p.grad is not None:
            p.grad.div_(n)
    return (torch.cat(kept) if kept else None), total / n


def outputs(step: TrainStep, weights: dict[str, torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor],
            rows: int, micro: int | None = None, keep: torch.dtype = torch.float32,
            grads: bool = True) -> tuple[torch.Tensor, float, dict[str, torch.Tensor]]:
    """Logits of the first `rows` sequences (real vocabulary), loss and gradients of one batch at given weights;
    with `micro`, accumulated over micro-batches of that many sequences (accumulate). They are kept on the host in
    `keep` (fp32; the fp64 reference keeps float64); `grads` False: the gradients stay where they are (none
    returned), for a check that reads the logits alone."""
    step.reset(weights)
    x, y = (t.to(step.device) for t in batch)
    logits, loss = accumulate(step, x, y, micro, rows)
    # A padded vocabulary is compared on the real one: its first rows and logits.
    kept = host_copy({n: step.reference_part(n, p.grad) for n, p in step.params.items()
                      if p.grad is not None}, keep) if grads else {}
    if logits is None:  # a forward that returns a loss only (models/definition.py): loss and gradients are compared
        logits = torch.empty(rows, x.shape[1], 0)
    return logits[:rows, :, :step.vocab_size].detach().to(keep).cpu(), float(loss.detach()), kept


def host_copy(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Tensors copied to the host in `dtype` in one transfer (one flat buffer, its views by name): no copy and no
    sync per tensor."""
    if not tensors:
        return {}
    flat = torch.cat([t.detach().reshape(-1).to(dtype) for t in tensors.values()]).cpu()
    out, at = {}, 0
    for n, t in tensors.items():
        out[n] = flat[at:at + t.numel()].view(t.shape)
        at += t.numel()
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def worst_grad(grads: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> tuple[str, float]:
    """The tensor whose gradient differs most from the reference's, relative to its own norm; a missing one is inf."""
    errors = {n: rel(grads[n], g) if n in grads and grads[n].shape == g.shape else float("inf")
              for n, g in ref.items()}
    name = max(errors, key=errors.__getitem__)
    return name, errors[name]


def causality(step: TrainStep, weights: dict[str, torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor],
              rows: int, vocab: int) -> Causality:
    """Change every token after the middle position; the logits up to it must stay within the noise."""
    x, y = batch
    t = x.shape[1] // 2
    changed = x.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + 1) % vocab
    a, _, _ = outputs(step, weights, (x, y), rows, grads=False)
    if a.numel() == 0:
        return not_applicable(Causality, "the forward returns a loss only: no logits per position to probe")
    again, _, _ = outputs(step, weights, (x, y), rows, grads=False)
    b, _, _ = outputs(step, weights, (changed, y), rows, grads=False)
    noise = float((a - again).abs().max())
    past = float((a[:, :t + 1] - b[:, :t + 1]).abs().max())
    future = float((a[:, t + 1:] - b[:, t + 1:]).abs().max())
    tol = TOLERANCES[step.spec.precision]
    allowed = max(tol.causal_noise_k * noise, tol.causal_floor * float(a.pow(2).mean().sqrt()))
    passed = past <= allowed and future > allowed  # the probe must move the future, or it tested nothing
    detail = "" if passed else (
        f"causality: changing tokens after position {t} moved the logits before it by {past:.2e} "
        f"(allowed {allowed:.2e}): the rung lets a position see the future" if past > allowed else
        f"causality: changing tokens after position {t} did not move the later logits: the probe is blind here")
    return Causality(position=t, past_max_abs=past, future_max_abs=future, noise_max_abs=noise, allowed=allowed,
                     passed=passed, detail=detail,
                     how=f"tokens after {t} changed; logits up to {t} compared, at weights x{PROBE_AMPLIFY:g}")
