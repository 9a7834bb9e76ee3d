"""Two probes of a candidate's step that the gates do not make, run in its worker before its gates.

- **Stale outputs.** Three forward-backward passes at the initial weights, on batches A, B, A: two consecutive
  passes on different batches must not give the same loss where eager fp32's differ. A step that reuses an earlier
  call's outputs (a cache across steps) returns the same loss twice.
- **Evaluation.** One forward in training mode and one in eval mode, same weights, same batch, no dropout: they must
  agree. A candidate that computes another function when evaluated (a lower precision, a shortcut) differs.

Both run at the initial weights with every matrix tripled, so that the logits stand well away from zero and a
lower precision shows in them. Each returns None, or one line saying what it found.
"""

from __future__ import annotations

import itertools

import torch

from speedladder.step.train_step import AUTOCAST, TrainStep, matmul_precision

# Two passes on different batches "give the same loss" within this relative distance; eager fp32's two losses
# differ by far more (the probe says so when they do not, rather than judge).
SAME_LOSS = 1e-7
# Eval mode and training mode run the same code on the same weights: any difference beyond float noise is another
# function. 1e-5 of the logits' largest magnitude is a hundred times fp32's unit roundoff; bf16's is 4e-3.
EVAL_TOLERANCE = 1e-5
AMPLIFY = 3.0  # every matrix of the initial weights times this: logits of a few units, not of a few hundredths


def probe_weights(step: TrainStep) -> dict[str, torch.Tensor]:
    return {n: w * AMPLIFY if w.ndim >= 2 else w for n, w in step.init.items()}


def _loss(step: TrainStep, x: torch.Tensor, y: torch.Tensor) -> float:
    with matmul_precision(step.spec):
        _, loss = step.forward_backward(x, y)
    for p in step.params.values():
        p.grad = None
    return float(loss.detach())


def stale_outputs(step: TrainStep, plain: TrainStep, a: tuple[torch.Tensor, torch.Tensor],
                  b: tuple[torch.Tensor, torch.Tensor]) -> str | None:
    """The candidate's loss on A, B, A beside eager fp32's on A and B, all at the initial weights."""
    step.reset(probe_weights(step))
    plain.reset(probe_weights(plain))
    ref_a, ref_b = _loss(plain, *a), _loss(plain, *b)
    mine = [_loss(step, *a), _loss(step, *b), _loss(step, *a)]
    step.reset()
    if abs(ref_a - ref_b) <= 1e-3 * abs(ref_a):
        return None  # the two batches are too alike to tell
    for first, second in itertools.pairwise(mine):
        if abs(first - second) <= SAME_LOSS * max(abs(first), 1.0):
            return (f"stale outputs: two different batches gave the same loss ({first:.6f} and {second:.6f}; eager "
                    f"fp32 gives {ref_a:.6f} and {ref_b:.6f})")
    return None


def eval_differs(step: TrainStep, x: torch.Tensor, y: torch.Tensor) -> str | None:
    """The candidate's logits (its loss, for a model that returns none) in training mode and in eval mode, at the
    probe weights, without gradients."""
    step.reset(probe_weights(step))
    flags = [(m, m.training) for m in step.model.modules()]
    autocast = torch.autocast(step.device.type, dtype=AUTOCAST.get(step.spec.autocast or "", torch.bfloat16),
                              enabled=step.spec.autocast in AUTOCAST)
    try:
        with torch.no_grad(), matmul_precision(step.spec), autocast:
            trained = step.eager_forward(x, y)
            step.model.eval()
            evaluated = step.eager_forward(x, y)
    finally:
        for m, training in flags:
            m.training = training
        step.reset()
    t, e = (trained[0], evaluated[0]) if trained[0] is not None and evaluated[0] is not None else (
        trained[1], evaluated[1])
    t, e = t.detach().float(), e.detach().float()
    scale = float(t.abs().max()) or 1.0
    moved = float((t - e).abs().max()) / scale
    if moved > EVAL_TOLERANCE:
        return (f"evaluates another function: its outputs in eval mode differ from those in training mode by "
                f"{moved:.1e} of their scale, same weights and batch")
    return None
