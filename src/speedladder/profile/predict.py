"""Predict each rung's speed-up from the baseline's profile: a written model, checked against the measurement.

The model keeps a per-step time budget in parts, starting from the profiled
baseline, and lets each rung rescale the parts it touches. A rung's predicted
× is tokens/s after it over tokens/s before it, so predictions chain along
the ladder exactly as the measured × prev do. Only ratios are used: the
profiler's own overhead inflates every part of the profiled step alike.

How the parts make a step (`step_ms`): on a CPU the host is the device, and a
step is their sum. On CUDA the host queues work while the device runs it: a
step is about the larger of the host's time (`overhead`) and the device's (the
sum of the other parts), plus what did not overlap (`serial`). So a rung that
shrinks the device's time below the host's buys nothing more: the step has
become host-bound (docs/profile.md, "Host and device").

The parts:
  matmul       weight matmuls, less each operator's fixed cost
  attn_matmul  the hand-written attention's two batched matmuls (scores, weighted sum)
  attention    fused attention kernels
  attn_tail    the hand-written attention's mask and softmax, forward and backward
  tail         the rest of the elementwise, normalization, reductions, softmax, loss
  copies     copies, layout changes, host-to-device
  optimizer  the optimizer's update and zero_grad, fixed cost included (per step, not per token)
  overhead   CPU: the time between operators plus every operator's fixed cost; CUDA: the host's time a step, which
             overlaps the device's (per step, not per token)
  serial     CUDA: the part of the unprofiled step that did not overlap (0 on a CPU)
  other      operators this model does not know; left alone by every rung

The device facts come from the profile's measurements on this device
(profile.matmul_facts: this model's own matmul shapes in fp32 and bf16, at
the batch and at the batch-up multiple), never from a datasheet alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from speedladder import processor
from speedladder.profile import quartiles
from speedladder.profile.categories import IDLE
from speedladder.records import CategoryTime, MatmulFacts, ProfilePrediction, ProfileSummary
from speedladder.records.profile_summary import BF16, FP32
from speedladder.rungs import RUNGS, Env
from speedladder.spec import StepSpec

# Rungs whose prediction reads this model's own matmul shapes (profile.matmul_facts) or its GPT sizes: for an
# architecture whose shapes are unknown there is no prediction, rather than an invented one.
NEEDS_SHAPES = ("bf16", "batch", "sdpa", "pad-vocab", "muon")
NO_MODEL = "no prediction model for this architecture (its matmul shapes are unknown)"

PARTS: tuple[str, ...] = ("matmul", "attn_matmul", "attention", "attn_tail", "tail", "copies", "optimizer",
                          "overhead", "serial", "other")
HOST_PARTS = ("overhead", "serial")  # on CUDA, the parts that are not device time
# The hand-written attention's operators outside its matmuls (model.py: masked_fill, softmax).
ATTENTION_TAIL_OPS = ("aten::masked_fill", "aten::masked_fill_", "aten::_softmax", "aten::_softmax_backward_data")

# Assumptions, each a number a reader can argue with:
FUSION_KEEPS = 1 / 3  # compile: fusing the tail reads and writes each tensor once instead of ~3 times (bytes)
COMPILE_OVERHEAD_KEEPS = 1 / 3  # compile (CPU): one graph call replaces hundreds of dispatched ops in forward/backward
# compile (CUDA): the host's time kept. Inductor's code still launches every kernel from Python (each matmul on its
# own, the tail fused into fewer), and the update (optimizer, clipping) and the batch stay eager. On the H200
# (2026-12-04) a compiled bf16 step was host-bound at 11.7 ms where eager bf16 was at 12.9-18.4 ms: 63-90% kept (docs/profile.md).
COMPILE_HOST_KEEPS = 2 / 3
BF16_ATTENTION_GAIN = 2.0  # bf16: fused attention kernels move half the bytes
RECOMPUTE = 4 / 3  # ckpt: forward is ~1/3 of forward+backward work, done twice
GRAPH_OVERHEAD_KEEPS = 0.1  # CUDA graphs: one replay launches every kernel of the graph; ~10% of the host cost stays
AUTOTUNE_MATMUL_KEEPS = 0.9  # max-autotune: the best of several matmul tilings, ~10% over the default (assumed)
FP8_LINEAR_GAIN = 1.6  # fp8: 2x bf16's peak, ~1.6x realized on large linears (assumed; small ones can lose)
FP8_TAIL_COST = 1.1  # fp8: scaling (amax) and casts add ~10% to the elementwise tail (assumed)
ADAMW_BYTES_PER_PARAM = 28  # fused AdamW reads param, grad, m, v and writes param, m, v: 7 fp32 tensors
NEWTON_SCHULZ_STEPS = 5  # Muon's orthogonalization, per hidden matrix per step


@dataclass(frozen=True)
class Prediction:
    rung: str
    speedup: float | None  # tokens/s after this rung over tokens/s of the spec it builds on; None: no prediction
    reason: str
    parts_ms: dict[str, float]  # the predicted step, per part, after this rung (profiled ms, inflated alike)
    tokens_per_step: int
    # The same prediction made from each profiled step alone: its interquartile range (None: no steps kept)
    speedup_iqr: list[float] | None = None
    host_ms: float | None = None  # CUDA: the predicted step's host time, device time and which bounds it
    device_ms: float | None = None
    bound: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def record(self) -> ProfilePrediction:
        """As results.json keeps it."""
        return ProfilePrediction(self.rung, self.speedup, self.reason, dict(self.parts_ms), self.tokens_per_step,
                                 self.speedup_iqr, self.host_ms, self.device_ms, self.bound)


def baseline_parts(profile: ProfileSummary) -> dict[str, float]:
    """The profiled step in the model's parts (ms per step). Where host and device are apart (CUDA), the device's
    parts are its kernel time by category, scaled to its busy time (the union of the kernels: overlapping ones once),
    `overhead` is the host's time and `serial` what did not overlap."""
    c = profile.categories

    def net(name: str) -> float:  # a category's time less its operators' fixed cost
        return c[name].ms - c[name].floor_ms

    floors = sum(c[name].floor_ms for name in c if name not in (IDLE, "optimizer"))
    matmul = net("matmul")
    attn_frac = profile.matmuls.attention_fraction.get(FP32, 0.0)
    tail = net("elementwise & norm") + net("reductions & softmax")
    ops = profile.ops_ms
    attn_tail = min(sum(ops.get(n, 0.0) for n in ATTENTION_TAIL_OPS), tail)
    parts = {
        "matmul": matmul * (1 - attn_frac), "attn_matmul": matmul * attn_frac, "attention": net("attention"),
        "attn_tail": attn_tail, "tail": tail - attn_tail, "copies": net("copies & H2D"),
        "optimizer": c["optimizer"].ms, "overhead": c[IDLE].ms + floors, "serial": 0.0, "other": c["other"].ms,
    }
    if not profile.apart:
        return parts
    assert profile.host_ms is not None and profile.device_ms is not None  # apart
    kernels = sum(v for k, v in parts.items() if k not in HOST_PARTS) or 1.0
    k = profile.device_ms / kernels
    return {**{n: v * k for n, v in parts.items() if n not in HOST_PARTS}, "overhead": profile.host_ms,
            "serial": profile.serial_ms or 0.0}


def device_ms(parts: dict[str, float]) -> float:
    """The device's time a step, where host and device are apart: every part but the host's."""
    return sum(v for k, v in parts.items() if k not in HOST_PARTS)


def step_ms(parts: dict[str, float], apart: bool) -> float:
    """A step from its parts: their sum on a CPU (the host is the device); on CUDA the larger of the host's time and
    the device's, plus what does not overlap."""
    if not apart:
        return sum(parts.values())
    return max(parts["overhead"], device_ms(parts)) + parts.get("serial", 0.0)


@dataclass(frozen=True)
class Context:
    parts: dict[str, float]
    before: StepSpec
    after: StepSpec
    profile: ProfileSummary

    @property
    def apart(self) -> bool:
        """Host and device apart (CUDA): the step is the larger of the two (step_ms)."""
        return self.profile.apart

    def share(self, *names: str) -> float:
        """The parts' share of the step; apart, a device part's share of the device's time."""
        if self.apart and not set(names) & set(HOST_PARTS):
            return sum(self.parts[n] for n in names) / (device_ms(self.parts) or 1.0)
        return sum(self.parts[n] for n in names) / (sum(self.parts.values()) or 1.0)

    def sides(self) -> str:
        """Apart: the host's and the device's time a step, and which bounds it ("" on a CPU)."""
        if not self.apart:
            return ""
        host, device = self.parts["overhead"], device_ms(self.parts)
        return f"host {host:.1f} ms, device {device:.1f} ms a step ({'host' if host >= device else 'device'}-bound)"

    def scaled(self, **factors: float) -> dict[str, float]:
        return {k: v * factors.get(k, 1.0) for k, v in self.parts.items()}


Predictor = Callable[[Context], tuple[dict[str, float], str]]


def _facts(c: Context) -> MatmulFacts:
    return c.profile.matmuls


def _prec(spec: StepSpec) -> str:
    """The precision of the measured matmul facts that applies: TF32 is fp32 storage."""
    return "bf16" if spec.precision == "bf16" else "fp32"


def _bytes_bound(c: Context) -> tuple[float, str]:
    """The share of the memory-bound operators' time that their bytes account for at the copy bandwidth here.

    Learned from the miss explanations (profile/explain.py): on a CPU, compile's fused loops did not save what
    fusion's cut in bytes promised, because eager's elementwise operators were not moving bytes at the rate a
    large copy does (in the CPU example, 19.5 of 123 GB/s). Roofline: an operator that moves b bytes in t
    seconds at a fraction f = (b/t) / copy bandwidth of the ceiling spends only f*t on the bytes; removing bytes
    removes at most that part. Both rates are measured in the profile; without them f = 1 (the old model).
    """
    mem, copy = c.profile.memory_gbps, c.profile.copy_gbps
    if not mem or not copy:
        return 1.0, ""
    f = min(1.0, mem / copy)
    return f, (f"; they move {mem:.1f} GB/s against a large copy's {copy:.1f} GB/s here, so bytes are {f:.0%} "
               "of their time")


def _fusion(c: Context) -> tuple[float, str]:
    """What compile's fusion keeps of the tail's and the copies' time (bytes cut to FUSION_KEEPS, which pays on the
    share of their time the bytes take), and the words for it."""
    f, bound = _bytes_bound(c)
    return 1 - (1 - FUSION_KEEPS) * f, bound  # fusion removes ~2/3 of the bytes, which are a share f of the time


def _compile(c: Context) -> tuple[dict[str, float], str]:
    k, bound = _fusion(c)
    keeps = COMPILE_HOST_KEEPS if c.apart else COMPILE_OVERHEAD_KEEPS
    parts = c.scaled(tail=k, attn_tail=k, copies=k, overhead=keeps)
    if c.apart:
        return parts, (f"{c.sides()}; elementwise/norm/softmax tail {c.share('tail', 'attn_tail'):.0%} and copies "
                       f"{c.share('copies'):.0%} of the device's time, fusion removes ~2/3 of their traffic{bound}; "
                       f"the host keeps ~{keeps:.0%} of its time (each kernel still launched from Python, the update "
                       "and the batch eager)")
    return parts, (f"elementwise/norm/softmax tail {c.share('tail', 'attn_tail'):.0%} and copies "
                   f"{c.share('copies'):.0%} of the step, fusion removes ~2/3 of their traffic{bound}; host overhead "
                   f"{c.share('overhead'):.0%}, ~2/3 of it removed")


def _bf16(c: Context) -> tuple[dict[str, float], str]:
    ratio = _facts(c).bf16_speedup
    if c.before.precision == "bf16":
        return c.parts, "already bf16: nothing changes"
    if not ratio:
        return c.parts, "no bf16 matmul measurement on this device: predicted unchanged"
    parts = c.scaled(matmul=1 / ratio, attn_matmul=1 / ratio, attention=1 / BF16_ATTENTION_GAIN)
    # The tail stays fp32 in this model: autocast keeps norms, softmax and the loss in fp32.
    why = ""
    if c.profile.device_type == "cpu" and processor.cpu().bf16_native is False:  # why bf16 loses on this CPU
        why = f"; this CPU has no native bf16 ({processor.cpu().why})"
    where = "the device's time" if c.apart else "the step"
    return parts, (f"{c.sides() + '; ' if c.apart else ''}matmuls {c.share('matmul', 'attn_matmul'):.0%} of {where}; "
                   f"in bf16 they run at {ratio:.2f}x their fp32 speed at this model's shapes (measured here, casts "
                   f"included){why}; the fp32 tail is unchanged" + _host_bound(c, parts))


def _batch(c: Context) -> tuple[dict[str, float], str]:
    k = c.after.batch_size / c.before.batch_size
    m = _facts(c)
    gain = m.batch_gain.get(_prec(c.before))
    if not gain or m.multiplier != round(k):
        gain, source = 1.0, "no measurement at this multiple: matmuls assumed to scale linearly"
    else:
        source = f"matmuls {gain:.2f}x as efficient at {k:.0f}x the rows (measured here)"
    # Per token: the fixed per-step costs are spread over k times the tokens; the rest grows with the batch.
    parts = c.scaled(matmul=k / gain, attn_matmul=k / gain, attention=k, attn_tail=k, tail=k, copies=k, other=k)
    if c.apart:
        return parts, (f"{c.sides()}; the host's time and the optimizer are paid per step, the rest of the device's "
                       f"time grows with {k:.0f}x the tokens; {source}" + _host_bound(c, parts))
    fixed = c.share("overhead", "optimizer")
    return parts, f"per-step costs (host overhead + optimizer {fixed:.0%}) spread over {k:.0f}x the tokens; {source}"


def _accum(c: Context) -> tuple[dict[str, float], str]:
    n = c.after.accum / c.before.accum  # micro-steps per update, over the base's
    m = c.after.micro_batch / c.before.micro_batch  # each micro-step's rows, over the base's step's
    compute = {k: v * n * m for k, v in c.parts.items() if k not in ("optimizer", "overhead", "serial")}
    parts = dict(c.parts, **compute, overhead=c.parts["overhead"] * n)
    return parts, (f"{c.after.accum} micro-steps of {c.after.micro_batch} per update: forward and backward "
                   f"scale with the rows (matmuls assumed linear in them), host overhead "
                   f"({c.share('overhead'):.0%}) is paid per micro-step, the optimizer ({c.share('optimizer'):.0%}) "
                   "once per update")


def _fp16(c: Context) -> tuple[dict[str, float], str]:
    return c.parts, "no fp16 matmul measurement in the profile: predicted unchanged"


def _ckpt(c: Context) -> tuple[dict[str, float], str]:
    r = RECOMPUTE
    parts = c.scaled(matmul=r, attn_matmul=r, attention=r, attn_tail=r, tail=r, overhead=1 + (r - 1) / 2)
    return parts, ("recomputes each block's forward in backward: ~1/3 more compute, activation memory "
                   "~3x less (a memory rung, expected to cost speed)")


def _sdpa(c: Context) -> tuple[dict[str, float], str]:
    # Assumed: the fused kernel costs what the attention's two matmuls cost; the T x T scores are never
    # written, so the mask and softmax traffic (and their backward) vanish.
    parts = dict(c.parts, attention=c.parts["attention"] + c.parts["attn_matmul"], attn_matmul=0.0, attn_tail=0.0)
    return parts, (f"the hand-written attention's mask and softmax ({c.share('attn_tail'):.0%} of the step) never "
                   f"touch memory in a fused kernel; its matmuls ({c.share('attn_matmul'):.0%}) stay")


def _fused_adamw(c: Context) -> tuple[dict[str, float], str]:
    params, gbps = c.profile.params, c.profile.copy_gbps
    if not params or not gbps:
        return c.parts, "no parameter count or bandwidth in the profile: predicted unchanged"
    floor_ms = ADAMW_BYTES_PER_PARAM * params / (gbps * 1e9) * 1e3
    new = min(c.parts["optimizer"], floor_ms)
    return dict(c.parts, optimizer=new), (
        f"the optimizer ({c.share('optimizer'):.0%} of the step) becomes one pass over {params:,} parameters at the "
        f"copy bandwidth measured here ({gbps:.0f} GB/s): {new:.2f} ms")


def _pad_vocab(c: Context) -> tuple[dict[str, float], str]:
    m = _facts(c)
    p = _prec(c.before)
    gain = (m.pad_vocab_speedup or {}).get(p)
    head = m.head_fraction.get(p, 0.0)
    if not gain:
        return c.parts, "vocabulary already a multiple of 64, or the head was not measured: unchanged"
    factor = 1 - head + head / gain
    return c.scaled(matmul=factor), (f"the head is {head:.0%} of the matmul time; padded to a multiple of 64 it runs "
                                     f"at {gain:.2f}x its speed (measured here)")


def _host_bound(c: Context, parts: dict[str, float]) -> str:
    """Apart: what the predicted step is bound by, when the rung moves it from the device to the host or back."""
    if not c.apart:
        return ""
    host, device = parts["overhead"], device_ms(parts)
    before = c.parts["overhead"] >= device_ms(c.parts)
    if (host >= device) == before:
        return ""
    return (f"; the device's {device:.1f} ms now fall below the host's {host:.1f} ms: host-bound" if host >= device
            else f"; the host's {host:.1f} ms now fall below the device's {device:.1f} ms: device-bound")


def _graphs(c: Context, matmul: float, why: str) -> tuple[dict[str, float], str]:
    """CUDA graphs (torch.compile mode reduce-overhead or max-autotune): a replay launches the whole graph, so
    GRAPH_OVERHEAD_KEEPS of the host's time stays (the update is not in the graph). Apart, from an eager base, the
    mode compiles too: the tail is fused as compile's is."""
    if not c.apart:
        return c.scaled(matmul=matmul, attn_matmul=matmul, overhead=GRAPH_OVERHEAD_KEEPS), why
    k, bound = _fusion(c) if not c.before.compile else (1.0, "")
    parts = c.scaled(matmul=matmul, attn_matmul=matmul, tail=k, attn_tail=k, copies=k,
                     overhead=GRAPH_OVERHEAD_KEEPS)
    fused = (f"; it compiles too: the tail and copies ({c.share('tail', 'attn_tail', 'copies'):.0%} of the device's "
             f"time) fused, ~2/3 of their traffic removed{bound}" if not c.before.compile else "")
    after = "host" if parts["overhead"] >= device_ms(parts) else "device"
    return parts, (f"{c.sides()}; {why}{fused}; the step becomes {after}-bound at "
                   f"{max(parts['overhead'], device_ms(parts)):.1f} ms")


def _max_autotune(c: Context) -> tuple[dict[str, float], str]:
    return _graphs(c, AUTOTUNE_MATMUL_KEEPS, (
        f"assumed: autotuned matmul tiles ~10% faster on matmuls ({c.share('matmul', 'attn_matmul'):.0%}), "
        f"CUDA graphs remove ~90% of host overhead ({c.share('overhead'):.0%})" if not c.apart else
        "assumed: autotuned matmul tiles ~10% faster on matmuls, CUDA graphs remove ~90% of the host's time"))


def _cudagraphs(c: Context) -> tuple[dict[str, float], str]:
    return _graphs(c, 1.0, (
        f"CUDA graphs replay the step's kernels without the host: ~90% of host overhead "
        f"({c.share('overhead'):.0%} of the step) goes; the optimizer is not in the graph" if not c.apart else
        "CUDA graphs replay the step's kernels without the host: ~90% of the host's time goes (the optimizer is not "
        "in the graph)"))


def _muon(c: Context) -> tuple[dict[str, float], str]:
    model = c.profile.model
    ceiling = _facts(c).ceiling_tflops.get(BF16 if c.profile.device_type == "cuda" else FP32)
    if not model or not ceiling:
        return c.parts, "no model shape or matmul ceiling in the profile: predicted unchanged"
    w, h = model["n_embd"], model["mlp_hidden"]
    flops = 0.0
    for rows, cols in ((w, 3 * w), (w, w), (w, h), (h, w)):
        m, n = min(rows, cols), max(rows, cols)
        flops += NEWTON_SCHULZ_STEPS * (4 * m * m * n + 2 * m**3)  # X Xt, A A, B X per iteration
    flops *= model["n_layer"]
    extra_ms = flops / (ceiling * 1e12) * 1e3
    return dict(c.parts, optimizer=c.parts["optimizer"] + extra_ms), (
        f"Newton-Schulz: {NEWTON_SCHULZ_STEPS} iterations over the hidden matrices, {flops / 1e9:.2f} GFLOP a step at "
        f"the {ceiling:.3g} TFLOP/s measured here (+{extra_ms:.2f} ms); Muon pays in tokens to a loss, not tokens/s")


def _fp8(c: Context) -> tuple[dict[str, float], str]:
    return c.scaled(matmul=1 / FP8_LINEAR_GAIN, tail=FP8_TAIL_COST), (
        f"assumed: linear layers ({c.share('matmul'):.0%} of the step) ~{FP8_LINEAR_GAIN}x faster in fp8, scaling "
        "and casts ~10% more tail; small shapes can lose")


def _same(c: Context) -> tuple[dict[str, float], str]:
    return c.parts, "the profiled baseline"


def _architecture(c: Context) -> tuple[dict[str, float], str]:
    return c.parts, ("an architecture rung changes the function, not the kernels: about the same step (the few "
                     "elementwise operators it adds are not counted); the race, not tokens/s, says whether it pays")


PREDICTORS: dict[str, Predictor] = {
    "eager": _same,
    "compile": _compile,
    "bf16": _bf16,
    "batch": _batch,
    "accum": _accum,
    "fp16": _fp16,
    "ckpt": _ckpt,
    "sdpa": _sdpa,
    "fused-adamw": _fused_adamw,
    "pad-vocab": _pad_vocab,
    "max-autotune": _max_autotune,
    "cudagraphs": _cudagraphs,
    "muon": _muon,
    "fp8": _fp8,
    "fp8-tensorwise": _fp8,  # the same assumed gain: the recipes differ in their scales, not their matmuls
}


def chain(profile: ProfileSummary, names: tuple[str, ...] | list[str], base: StepSpec, env: Env) -> list[Prediction]:
    """Predictions for rungs applied in order from the profiled baseline, each on the one before.

    Each carries the interquartile range of the same prediction made from every
    profiled step alone (where the profile kept its steps); when the regime is
    borderline, the reason says so and gives that range.
    """
    preds = _chain(profile, names, base, env)
    per_step = [_chain(p, names, base, env) for p in _step_profiles(profile)]
    if not per_step:
        return preds
    out = []
    for i, p in enumerate(preds):
        xs = [x for s in per_step if (x := s[i].speedup) is not None]
        if p.speedup is None or not xs:
            out.append(p)
            continue
        lo, hi = quartiles.iqr(xs)
        reason = p.reason
        if profile.borderline and hi - lo >= 0.005:  # a rung the shares do not move (eager) has nothing to add
            reason += f"; {profile.label}: {lo:.2f}–{hi:.2f}x over the profiled steps' quartiles"
        out.append(dataclasses.replace(p, reason=reason, speedup_iqr=[lo, hi]))
    return out


def _step_profiles(profile: ProfileSummary) -> list[ProfileSummary]:
    """The profile as each profiled step alone would have it: that step's categories (and device time), every other
    fact kept."""
    out = []
    for step in profile.per_step:
        total = sum(step.ms.values()) or 1.0
        cats = {c: CategoryTime(ms=v, share=v / total, floor_ms=step.floor_ms.get(c, 0.0)) for c, v in step.ms.items()}
        device = step.device_ms if step.device_ms is not None else profile.device_ms
        out.append(dataclasses.replace(profile, categories=cats, per_step=[], device_ms=device))
    return out


def _chain(profile: ProfileSummary, names: tuple[str, ...] | list[str], base: StepSpec, env: Env) -> list[Prediction]:
    parts = baseline_parts(profile)
    spec = base
    out = []
    for name in names:
        after = RUNGS[name].transform(spec, env)
        predictor = PREDICTORS.get(name) or (_architecture if RUNGS[name].kind == "architecture" else None)
        unknown = name in NEEDS_SHAPES and not profile.matmuls.measured
        if predictor is None or unknown:
            out.append(Prediction(name, None, NO_MODEL if unknown else "no prediction model for this rung",
                                  dict(parts), after.tokens_per_step))
            spec = after
            continue
        new, why = predictor(Context(parts, spec, after, profile))
        before_rate = spec.tokens_per_step / (step_ms(parts, profile.apart) or 1.0)
        after_rate = after.tokens_per_step / (step_ms(new, profile.apart) or 1.0)
        x = after_rate / before_rate
        host, device = (new["overhead"], device_ms(new)) if profile.apart else (None, None)
        bound = None if host is None or device is None else ("host" if host >= device else "device")
        out.append(Prediction(name, x, f"{why} -> {name} ≈ {x:.2f}x", new, after.tokens_per_step, None, host, device,
                              bound))
        parts, spec = new, after
    return out
