"""Training curves and what the gates read from them: the loss band, tokens to a target loss, the learns-check
(docs/measurement.md, rules 7 and 9).

- Loss band: over the same first K gate batches, the rung's training loss stays within a stated fraction of eager
  fp32's, step by step.
- Tokens to a target: a rung that changes the update rule against AdamW, by the tokens each needs to reach AdamW's
  final loss.
- Learns-check: after the ladder, the fastest rung that passed trains for a few hundred steps beside eager fp32, and
  must learn as well.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from speedladder.data.batches import BatchStream
from speedladder.measure import devicemem
from speedladder.records.checks import LearnsCheck, LossBand, TokensToTarget, not_applicable
from speedladder.spec import StepSpec
from speedladder.step.train_step import TrainStep
from speedladder.verify import probes

Batch = tuple[torch.Tensor, torch.Tensor]

# Untimed training (the gates' curves) hands freed host memory back every this many steps: a 50k-vocabulary step
# frees tens of MB of logits, which the allocator would otherwise keep (devicemem.return_host_memory).
HAND_BACK_EVERY = 5


def train_step(step: TrainStep, x: torch.Tensor, y: torch.Tensor, micro: int | None = None) -> torch.Tensor:
    """One training step (the loss as a device tensor); with `micro`, its gradients accumulated over
    micro-batches of that many sequences first (probes.accumulate): the same mean loss and gradients, and so
    the same update, as one step on the whole batch."""
    if micro is None:
        return step(x, y)
    _, loss = probes.accumulate(step, x, y, micro, rows=0)
    step.update()  # the recipe's clipping, schedule and optimizer, as the step's own call applies them
    return loss


def loss_curve(step: TrainStep, batches: list[Batch], micro: int | None = None,
               advance: Callable[[], None] = lambda: None) -> list[float]:
    """Train from the initial weights over the given batches; the losses, read once at the end. `advance` is called
    after each step (a progress task's)."""
    step.reset()
    losses = []
    for i, (x, y) in enumerate(batches):
        losses.append(train_step(step, x.to(step.device), y.to(step.device), micro))
        advance()
        if i % HAND_BACK_EVERY == HAND_BACK_EVERY - 1:
            devicemem.return_host_memory()  # untimed: what the steps freed goes back (devicemem.return_host_memory)
    return torch.stack(losses).float().cpu().tolist()


def loss_band(curve: list[float], ref_curve: list[float], band: float) -> LossBand:
    """Step by step over the same batches, |loss - loss_ref| <= band * loss_ref."""
    worst = max(abs(a - b) / b for a, b in zip(curve, ref_curve))
    finite = all(math.isfinite(v) for v in curve)
    passed = finite and worst <= band
    detail = "" if passed else (
        "non-finite loss" if not finite else f"loss strays {worst:.1%} from eager fp32 (band {band:.0%})")
    return LossBand(steps=len(curve), band=band, max_rel_diff=worst, losses=curve, ref_losses=ref_curve,
                    passed=passed, detail=detail)


def no_loss_band(spec: StepSpec) -> LossBand:
    """A rung that changes the update rule follows its own curve: the band does not apply, and says why."""
    return not_applicable(LossBand, f"{spec.update_change or spec.optimizer + ' updates differently from AdamW'}, "
                                    "so its loss curve differs by design; compared by tokens to a target loss instead")


def tokens_to(losses: list[float], target: float, window: int, tokens_per_step: int) -> int | None:
    """Tokens trained until the running mean of `window` losses first reaches the target; None if never."""
    for i in range(window - 1, len(losses)):
        if sum(losses[i - window + 1: i + 1]) / window <= target:
            return (i + 1) * tokens_per_step
    return None


def tokens_to_target(step: TrainStep, adamw: TrainStep,
                     batches: list[tuple[torch.Tensor, torch.Tensor]]) -> TokensToTarget:
    """Both steps from the initial weights over the same batches: the tokens each needs to reach AdamW's
    final loss (the mean of its last tenth). Passes if the rung needs no more tokens than AdamW."""
    curves = {}
    for name, s in (("rung", step), ("adamw", adamw)):
        s.reset()
        curves[name] = torch.stack([s(x.to(s.device), y.to(s.device)) for x, y in batches]).float().cpu().tolist()
    window = max(1, len(batches) // 10)
    target = sum(curves["adamw"][-window:]) / window
    tps = batches[0][0].numel()
    ours, theirs = (tokens_to(curves[k], target, window, tps) for k in ("rung", "adamw"))
    finite = all(math.isfinite(v) for v in curves["rung"])
    passed = finite and ours is not None and theirs is not None and ours <= theirs
    if passed:
        detail = ""
    elif not finite:
        detail = "non-finite loss"
    elif ours is None:
        detail = f"never reached AdamW's loss {target:.3f} in {len(batches)} steps"
    else:
        detail = f"needed {ours:,} tokens to reach loss {target:.3f}, AdamW {theirs:,}"
    return TokensToTarget(steps=len(batches), target_loss=target, window=window, tokens=ours, adamw_tokens=theirs,
                          token_ratio=(theirs / ours) if ours and theirs else None, losses=curves["rung"],
                          adamw_losses=curves["adamw"], passed=passed, detail=detail)


def train_curve(step: TrainStep, stream: BatchStream, steps: int,
                on_progress: Callable[[str], None] = lambda msg: None, micro: int | None = None) -> list[float]:
    """Train from the initial weights for `steps` steps; the losses, read back once at the end (and at log lines).
    `micro`: each step's gradients accumulated over micro-batches of that many sequences (train_step)."""
    step.reset()
    losses: list[torch.Tensor] = []
    every = max(1, steps // 10)
    for i in range(steps):
        losses.append(train_step(step, *next(stream), micro))
        if (i + 1) % every == 0 or i + 1 == steps:
            on_progress(f"step {i + 1}/{steps}, loss {float(losses[-1]):.3f}")
        if i % HAND_BACK_EVERY == HAND_BACK_EVERY - 1:
            devicemem.return_host_memory()  # untimed: the allocator keeps what steps free unless told (devicemem.py)
    return torch.stack(losses).float().cpu().tolist()


def final_loss(curve: list[float]) -> float:
    """The mean of the last tenth of a curve: one step's loss is too noisy to judge by."""
    tail = curve[-max(1, len(curve) // 10):]
    return sum(tail) / len(tail)


def learns_check(curve: list[float], eager_curve: list[float], band: float, unigram_entropy: float) -> LearnsCheck:
    """Learns as well as the baseline: over the same batches for the same steps, the fast configuration's final
    loss is within `band` of eager fp32's, and below the corpus's unigram entropy (what a model that ignores
    context and position can reach, letter or token frequencies alone)."""
    final, eager = final_loss(curve), final_loss(eager_curve)
    finite = all(math.isfinite(v) for v in curve)
    within = finite and final <= eager * (1 + band)
    below = finite and final < unigram_entropy
    if not finite:
        detail = "non-finite loss"
    elif not within:
        detail = (f"final loss {final:.3f} is {final / eager - 1:.1%} above eager fp32's {eager:.3f} over the same "
                  f"batches (band {band:.0%})")
    elif not below:
        detail = (f"final loss {final:.3f} is not below the corpus's unigram entropy {unigram_entropy:.3f}: no more "
                  "than token frequencies learned")
    else:
        detail = ""
    return LearnsCheck(steps=len(curve), first_loss=curve[0], final_loss=final, eager_final_loss=eager, band=band,
                       unigram_entropy=unigram_entropy, losses=curve, eager_losses=eager_curve,
                       drop=(curve[0] - final) / curve[0] if curve[0] else 0.0, passed=within and below, detail=detail)
