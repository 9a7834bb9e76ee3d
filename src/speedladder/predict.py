"""Predict each rung's speed-up from the baseline's profile: a written model, checked against the measurement.

The model keeps a per-step time budget in parts, starting from the profiled
baseline, and lets each rung rescale the parts it touches. A rung's predicted
× is tokens/s after it over tokens/s before it, so predictions chain along
the ladder exactly as the measured × prev do. Only ratios are used: the
profiler's own overhead inflates every part of the profiled step alike.

The parts:
  matmul     weight and attention-score matmuls, less each operator's fixed cost
  attention  fused attention kernels
  tail       elementwise, normalization, reductions, softmax, loss
  copies     copies, layout changes, host-to-device
  optimizer  the optimizer's update and zero_grad, fixed cost included (per step, not per token)
  overhead   the device waiting on the host, plus every operator's fixed cost (per step, not per token)
  other      operators this model does not know; left alone by every rung

The device facts come from the profile's measurements on this device
(profile.matmul_facts: this model's own matmul shapes in fp32 and bf16, at
the batch and at the batch-up multiple), never from a datasheet alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from speedladder.profile import IDLE
from speedladder.rungs import RUNGS, Env, StepSpec

PARTS: tuple[str, ...] = ("matmul", "attention", "tail", "copies", "optimizer", "overhead", "other")

# Assumptions, each a number a reader can argue with:
FUSION_KEEPS = 1 / 3  # compile: fusing the tail reads and writes each tensor once instead of ~3 times
COMPILE_OVERHEAD_KEEPS = 1 / 3  # compile: one graph call replaces hundreds of dispatched ops in forward/backward
BF16_ATTENTION_GAIN = 2.0  # bf16: fused attention kernels move half the bytes
RECOMPUTE = 4 / 3  # ckpt: forward is ~1/3 of forward+backward work, done twice


@dataclass(frozen=True)
class Prediction:
    rung: str
    speedup: float | None  # tokens/s after this rung over tokens/s of the spec it builds on; None: no prediction
    reason: str
    parts_ms: dict[str, float]  # the predicted step, per part, after this rung (profiled ms, inflated alike)
    tokens_per_step: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def baseline_parts(profile: dict) -> dict[str, float]:
    """The profiled step in the model's parts (ms per step)."""
    c = profile["categories"]

    def net(name: str) -> float:  # a category's time less its operators' fixed cost
        return c[name]["ms"] - c[name].get("floor_ms", 0.0)

    floors = sum(c[name].get("floor_ms", 0.0) for name in c if name not in (IDLE, "optimizer"))
    return {
        "matmul": net("matmul"), "attention": net("attention"),
        "tail": net("elementwise & norm") + net("reductions & softmax"), "copies": net("copies & H2D"),
        "optimizer": c["optimizer"]["ms"], "overhead": c[IDLE]["ms"] + floors, "other": c["other"]["ms"],
    }


@dataclass(frozen=True)
class Context:
    parts: dict[str, float]
    before: StepSpec
    after: StepSpec
    profile: dict

    def share(self, *names: str) -> float:
        return sum(self.parts[n] for n in names) / (sum(self.parts.values()) or 1.0)

    def scaled(self, **factors: float) -> dict[str, float]:
        return {k: v * factors.get(k, 1.0) for k, v in self.parts.items()}


Predictor = Callable[[Context], tuple[dict[str, float], str]]


def _compile(c: Context) -> tuple[dict[str, float], str]:
    parts = c.scaled(tail=FUSION_KEEPS, copies=FUSION_KEEPS, overhead=COMPILE_OVERHEAD_KEEPS)
    return parts, (f"elementwise/norm/reduction tail {c.share('tail'):.0%} and copies {c.share('copies'):.0%} "
                   f"of the step, fusion removes ~2/3 of their traffic; host overhead {c.share('overhead'):.0%}, "
                   "~2/3 of it removed")


def _bf16(c: Context) -> tuple[dict[str, float], str]:
    m = c.profile.get("matmuls") or {}
    ratio = m.get("bf16_speedup")
    if c.before.precision == "bf16":
        return c.parts, "already bf16: nothing changes"
    if not ratio:
        return c.parts, "no bf16 matmul measurement on this device: predicted unchanged"
    parts = c.scaled(matmul=1 / ratio, attention=1 / BF16_ATTENTION_GAIN)
    # The tail stays fp32 in this model: autocast keeps norms, softmax and the loss in fp32.
    return parts, (f"matmuls {c.share('matmul'):.0%} of the step; in bf16 they run at {ratio:.2f}x their fp32 speed "
                   "at this model's shapes (measured here, casts included); the fp32 tail is unchanged")


def _batch(c: Context) -> tuple[dict[str, float], str]:
    k = c.after.batch_size / c.before.batch_size
    m = c.profile.get("matmuls") or {}
    gain = (m.get("batch_gain") or {}).get(c.before.precision if c.before.precision != "tf32" else "fp32")
    if not gain or m.get("multiplier") != round(k):
        gain, source = 1.0, "no measurement at this multiple: matmuls assumed to scale linearly"
    else:
        source = f"matmuls {gain:.2f}x as efficient at {k:.0f}x the rows (measured here)"
    # Per token: the fixed per-step costs are spread over k times the tokens; the rest grows with the batch.
    parts = c.scaled(matmul=k / gain, attention=k, tail=k, copies=k, other=k)
    fixed = c.share("overhead", "optimizer")
    return parts, f"per-step costs (host overhead + optimizer {fixed:.0%}) spread over {k:.0f}x the tokens; {source}"


def _ckpt(c: Context) -> tuple[dict[str, float], str]:
    parts = c.scaled(matmul=RECOMPUTE, attention=RECOMPUTE, tail=RECOMPUTE, overhead=1 + (RECOMPUTE - 1) / 2)
    return parts, ("recomputes each block's forward in backward: ~1/3 more compute, activation memory "
                   "~3x less (a memory rung, expected to cost speed)")


def _same(c: Context) -> tuple[dict[str, float], str]:
    return c.parts, "the profiled baseline"


PREDICTORS: dict[str, Predictor] = {
    "eager": _same,
    "compile": _compile,
    "bf16": _bf16,
    "batch": _batch,
    "ckpt": _ckpt,
}


def chain(profile: dict, names: tuple[str, ...] | list[str], base: StepSpec, env: Env) -> list[Prediction]:
    """Predictions for rungs applied in order from the profiled baseline, each on the one before."""
    parts = baseline_parts(profile)
    spec = base
    out = []
    for name in names:
        after = RUNGS[name].transform(spec, env)
        predictor = PREDICTORS.get(name)
        if predictor is None:
            out.append(Prediction(name, None, "no prediction model for this rung", dict(parts),
                                  after.tokens_per_step))
            spec = after
            continue
        new, why = predictor(Context(parts, spec, after, profile))
        before_rate = spec.tokens_per_step / (sum(parts.values()) or 1.0)
        after_rate = after.tokens_per_step / (sum(new.values()) or 1.0)
        x = after_rate / before_rate
        out.append(Prediction(name, x, f"{why} -> {name} ≈ {x:.2f}x", new, after.tokens_per_step))
        parts, spec = new, after
    return out
