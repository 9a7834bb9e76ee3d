"""The kink census: where the function has kinks and ties, and a probe batch where no rounding can cross one
(docs/measurement.md, rule 12; the `kink_census` refinement).

ReLU's gradient jumps from 0 to 1 at 0; max, clamp, abs, a comparison, top-k and sort each have such points. An
input within rounding of one may land on either side in a rung that only re-rounds, and a gradient then moves by
a finite amount that no multiple of eager's error covers (on an AVX2 processor one ReLU input of block 0 within
1e-6 of zero moved the gradient of the position table by 8e-4, against eager's 3e-7). The gate cannot know which
side a correct rung's rounding lands on, so it probes where no element lies within the rounding band of a kink:

- The census runs a forward under a TorchDispatchMode over aten ops, which sees every kink and tie of any model
  (ours, a Hugging Face model, a user's): for each such op, the signed distance of its input from the kink
  (KINK_OPS), once at eager's precision (kept where it was computed) and once in float64, paired by op and
  occurrence as the float64 run goes; only the indices of the elements within the band leave the device.
- An element lies within the rounding band when its float64 distance is at most BAND_K times the RMS of eager's
  own deviation from float64 at that op's input. A constant input (a causal mask compared with 0) deviates by
  nothing and never counts.
- Sequences are independent in a causal language model, so the probe batch keeps the first gate batch's rows
  (whole sequences) in which no element lies in the band, at the trained and at the probe weights alike, and puts
  clean rows of the second gate batch in the others' places: one census of the candidates, never a sequence
  twice. Rows that find no clean replacement stay, and their kinks are priced (flip_pricing.py). The assembled
  batch is counted again: a model whose rows are not independent would show it, and the record says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from speedladder.records.checks import Kinks
from speedladder.step.train_step import TrainStep

aten = torch.ops.aten

# An element lies within rounding of a kink when its float64 distance from it is at most this many times the RMS
# of eager's deviation from float64 at that op's input. On d2l-cpu at the probe weights, with AVX2 forced, the
# elements a rounding fuzz of 2^-24 flipped in 30 seeds lay at 0.21 and 0.46 of that RMS, and the one eager fp32
# itself flipped at 0.21: 10 leaves a factor of 20 for a rung that rounds worse than eager.
BAND_K = 10.0

Batch = tuple[torch.Tensor, torch.Tensor]

_RELU_LIKE = {aten.relu, aten.relu_, aten.abs, aten.sign, aten.sgn, aten.leaky_relu, aten.leaky_relu_,
              aten.rrelu_with_noise}
_COMPARE = {aten.gt, aten.lt, aten.ge, aten.le, aten.eq, aten.ne, aten.maximum, aten.minimum, aten.fmax,
            aten.fmin}
_REDUCE_MAX = {aten.amax, aten.max, aten.argmax}
_REDUCE_MIN = {aten.amin, aten.min, aten.argmin}
_ROUNDING = {aten.floor, aten.ceil, aten.round, aten.trunc}
# Every aten op whose result jumps, or whose gradient jumps, at some value of its input: what the census looks at.
KINK_OPS = (_RELU_LIKE | _COMPARE | _REDUCE_MAX | _REDUCE_MIN | _ROUNDING
            | {aten.threshold, aten.threshold_, aten.clamp, aten.clamp_, aten.clamp_min, aten.clamp_min_,
               aten.clamp_max, aten.clamp_max_, aten.hardtanh, aten.hardtanh_, aten.relu6, aten.hardswish,
               aten.hardswish_, aten.hardsigmoid, aten.hardsigmoid_, aten.topk, aten.sort, aten.kthvalue,
               aten.median, aten.nanmedian})


def _value(x: torch.Tensor, bound: Any) -> torch.Tensor:
    return bound.to(x) if isinstance(bound, torch.Tensor) else torch.full((), float(bound), dtype=x.dtype,
                                                                             device=x.device)


def _gap(x: torch.Tensor, dim: int | None, largest: bool, k: int = 1) -> torch.Tensor | None:
    """The gap between the k-th and the (k+1)-th largest (or smallest) values along a dimension: a tie there
    decides which element gets the gradient."""
    if dim is None:
        x, dim = x.flatten(), 0
    if x.dim() == 0 or x.shape[dim] <= k:
        return None
    top = x.topk(k + 1, dim=dim, largest=largest).values
    return (top.narrow(dim, k - 1, 1) - top.narrow(dim, k, 1)).abs()


def _dim(args: tuple[Any, ...], kwargs: dict[str, Any], at: int = 1) -> int | None:
    dim = args[at] if len(args) > at else kwargs.get("dim")
    if isinstance(dim, (list, tuple)):
        return dim[0] if len(dim) == 1 else None
    return dim if isinstance(dim, int) else None


def distances(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor] | None:
    """The signed distances of a kink op's input from its kinks (one tensor per kink); None for any other op."""
    op = func.overloadpacket
    if op not in KINK_OPS:
        return None
    x = args[0] if args else kwargs.get("input", kwargs.get("self"))
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
        return None
    if op in _RELU_LIKE:
        return [x]
    if op in (aten.threshold, aten.threshold_):
        return [x - _value(x, args[1])]
    if op in (aten.clamp, aten.clamp_, aten.hardtanh, aten.hardtanh_):
        hard = op in (aten.hardtanh, aten.hardtanh_)
        lo = args[1] if len(args) > 1 else kwargs.get("min", kwargs.get("min_val", -1.0 if hard else None))
        hi = args[2] if len(args) > 2 else kwargs.get("max", kwargs.get("max_val", 1.0 if hard else None))
        return [x - _value(x, b) for b in (lo, hi) if b is not None]
    if op in (aten.clamp_min, aten.clamp_min_, aten.clamp_max, aten.clamp_max_):
        return [x - _value(x, args[1])]
    if op in _COMPARE:
        other = args[1] if len(args) > 1 else kwargs.get("other")
        if isinstance(other, torch.Tensor) and not other.is_floating_point():
            return None
        return [x - _value(x, other)]
    if op is aten.relu6:
        return [x, x - 6]
    if op in (aten.hardswish, aten.hardswish_, aten.hardsigmoid, aten.hardsigmoid_):
        return [x + 3, x - 3]
    if op in _REDUCE_MAX or op in _REDUCE_MIN:
        gap = _gap(x, _dim(args, kwargs), largest=op in _REDUCE_MAX)
        return None if gap is None else [gap]
    if op is aten.topk:
        k = int(args[1]) if len(args) > 1 else int(kwargs.get("k", 1))
        dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
        largest = args[3] if len(args) > 3 else kwargs.get("largest", True)
        gap = _gap(x, dim, largest=bool(largest), k=k)
        return None if gap is None else [gap]
    if op in (aten.sort, aten.kthvalue, aten.median, aten.nanmedian):
        dim = _dim(args, kwargs, at=2 if op is aten.kthvalue else 1)
        flat = x.flatten() if dim is None else x
        d = -1 if dim is None else dim
        return [flat.sort(dim=d).values.diff(dim=d)] if flat.shape[d] > 1 else None
    if op in _ROUNDING:
        return [x - x.round()]  # the jumps are at integers (floor, ceil, trunc) or half-integers (round): both near
    return None


@dataclass
class _Seen:
    """One forward's kink ops in order: eager's run keeps each op's distances where they were computed; the float64
    run, given eager's, keeps per op the near elements' flat indices (on the device) and its input's layout."""

    ops: list[tuple[str, list[torch.Tensor]]] = field(default_factory=list)
    against: list[tuple[str, list[torch.Tensor]]] | None = None  # eager's, for the float64 run to pair with
    # The float64 run's: per op, its name, per distance tensor its shape and the mask of near elements.
    near: list[tuple[str, list[tuple[torch.Size, torch.Tensor]]]] = field(default_factory=list)
    why: str = ""  # why the two runs could not be paired


def _near(d64: torch.Tensor, dl: torch.Tensor) -> torch.Tensor:
    """The elements of d64 within BAND_K x the RMS of eager's deviation from it; none where eager deviates by
    nothing (a constant, computed alike at every precision: rounding moves nothing there). No host sync."""
    band = BAND_K * (dl.double() - d64).pow(2).mean().sqrt()
    return (d64.abs() <= band) & (band > 0)


class _Census(TorchDispatchMode):
    def __init__(self, seen: _Seen) -> None:
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        with torch.no_grad():
            d = distances(func, args, kwargs)  # before the op: an in-place one overwrites its input
            if d is not None:
                _take(self.seen, func.overloadpacket.__name__, d)
        return func(*args, **kwargs)


def _take(seen: _Seen, name: str, d: list[torch.Tensor]) -> None:
    """One kink op's distances: kept (eager's run), or paired with eager's and reduced to the near elements."""
    if seen.against is None:  # eager's run: a copy (relu's distance is its input, which relu_ overwrites)
        seen.ops.append((name, [t.detach().clone() for t in d]))
        return
    at = len(seen.near)
    if seen.why:
        return
    if at >= len(seen.against) or seen.against[at][0] != name:
        seen.why = (f"the float64 run met {name} where eager met "
                    f"{seen.against[at][0] if at < len(seen.against) else 'no more kink ops'}: not the same "
                    "sequence, the census cannot pair them")
        return
    mine = seen.against[at][1]
    for d64, dl in zip(d, mine):
        if d64.shape != dl.shape:
            seen.why = (f"{name}'s input has shape {tuple(d64.shape)} in float64 and {tuple(dl.shape)} in eager: "
                        "the census cannot pair them")
            return
    seen.near.append((name, [(d64.shape, _near(d64.detach(), dl)) for d64, dl in zip(d, mine)]))


def record(step: TrainStep, weights: dict[str, torch.Tensor], batch: Batch,
           arithmetic: Callable[[], AbstractContextManager[Any]] = nullcontext,
           against: _Seen | None = None) -> _Seen:
    """One forward of `step` at the weights, on the batch, under `arithmetic` (the precision's emulation, for eager
    at a lower precision), under the census: eager's distances, or (given eager's, `against`) the float64 run's near
    elements."""
    step.reset(weights)
    x, y = (t.to(step.device) for t in batch)
    seen = _Seen(against=against.ops if against is not None else None)
    with torch.no_grad(), arithmetic(), _Census(seen):
        step.forward(x, y)
    return seen


def _row_of(shape: torch.Size, rows: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """How a flat index of a tensor of this shape maps to its sequence: the batch on the first dimension, or
    flattened with the positions (B*T first); None where the layout says nothing about sequences."""
    if len(shape) == 0 or shape[0] % rows:
        return None
    per_row = math.prod(shape) // rows
    return lambda flat: torch.div(flat, per_row, rounding_mode="floor")


@dataclass
class Count:
    """One census: elements within the band per op, and the sequences they lie in."""

    ops: int = 0  # kink ops seen
    elements: int = 0  # their input elements
    near: int = 0
    by_op: dict[str, int] = field(default_factory=dict)
    rows: set[int] = field(default_factory=set)  # the batch rows holding an element within the band
    unplaced: int = 0  # near elements whose row the layout does not tell
    why: str = ""  # why the two runs could not be paired ("" when they were)
    # The near elements of the ops whose value is continuous at the kink (relu, threshold, hardtanh, leaky_relu), by
    # the op's place among the kink ops, as flat indices on the device: a flip there moves the backward alone, and
    # flip_pricing can price it.
    flippable: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def unpriced(self) -> int:
        """Near elements at ops whose flip cannot be priced (a comparison, a tie of max, top-k or sort)."""
        return self.near - sum(t.numel() for t in self.flippable.values())


def _counted(seen: _Seen, rows: int) -> Count:
    """The float64 run's near elements counted: one host sync for every op's count, indices only where some lie."""
    if seen.why:
        return Count(why=seen.why)
    if len(seen.near) != len(seen.against or []):
        return Count(why=f"the float64 run met {len(seen.near)} kink ops and eager {len(seen.against or [])}, not the "
                         "same sequence: the census cannot pair them")
    out = Count(ops=len(seen.near))
    masks = [(place, name, shape, mask) for place, (name, parts) in enumerate(seen.near) for shape, mask in parts]
    out.elements = sum(math.prod(shape) for _, _, shape, _ in masks)
    sums = torch.stack([m.sum() for *_, m in masks]).tolist() if masks else []
    for (place, name, shape, mask), n in zip(masks, sums):
        if not n:
            continue
        near = mask.flatten().nonzero().flatten()
        out.near += int(n)
        out.by_op[name] = out.by_op.get(name, 0) + int(n)
        if name in FLIPPABLE:
            before = out.flippable.get(place)
            out.flippable[place] = near if before is None else torch.cat([before, near]).unique()
        row = _row_of(shape, rows)
        if row is None:
            out.unplaced += int(n)
        else:
            out.rows.update(row(near).unique().tolist())
    return out


def count(truth: _Seen, eager: _Seen, rows: int) -> Count:
    """Two recorded runs paired by op and occurrence: the float64 elements within BAND_K times eager's RMS deviation
    of their kink (for runs recorded apart; census() pairs them as the float64 run goes)."""
    if [n for n, _ in truth.ops] != [n for n, _ in eager.ops]:
        return Count(why=f"the float64 run met {len(truth.ops)} kink ops and eager {len(eager.ops)}, not the same "
                         "sequence: the census cannot pair them")
    seen = _Seen(against=eager.ops)
    for name, d64s in truth.ops:
        _take(seen, name, d64s)
    return _counted(seen, rows)


def census(truth: TrainStep, eager: TrainStep, weights: dict[str, torch.Tensor], batch: Batch,
           arithmetic: Callable[[], AbstractContextManager[Any]] = nullcontext) -> Count:
    """Elements within rounding of a kink in one batch at the given weights, with eager (under `arithmetic`)
    measuring the band: eager's forward, then the float64 one paired with it."""
    mine = record(eager, weights, batch, arithmetic)
    return _counted(record(truth, weights, batch, against=mine), batch[0].shape[0])


BAND = f"{BAND_K:g} x eager's RMS deviation from float64 at each kink op's input"
# The ops whose value is continuous at the kink: a flip there moves the backward alone, and flip_pricing can price it.
FLIPPABLE = {"relu", "relu_", "threshold", "threshold_", "hardtanh", "hardtanh_", "leaky_relu", "leaky_relu_"}


def _record(c: Count, first: Count, probe: str, rows: list[list[int]], detail: str) -> Kinks:
    return Kinks(ops=c.ops, elements=c.elements, near=c.near, near_first=first.near, by_op=dict(first.by_op),
                 band=BAND, probe=probe, rows=rows, detail=detail)


Chosen = tuple[Batch, dict[str, Kinks], dict[str, Count]]


def choose_probe(truth: TrainStep, eager: TrainStep, weights: dict[str, dict[str, torch.Tensor]],
                 batches: list[Batch]) -> Chosen:
    """The probe batch: the first gate batch's rows where no element lies within rounding of a kink at any of the
    named weights (the trained and the probe weights), the others replaced by clean rows of the second gate batch
    (one census of candidates; never a sequence twice); the census at each weights that chose it, and the count at
    the probe (what flip_pricing prices where the probe could not be made clean)."""
    first = {k: census(truth, eager, w, batches[0]) for k, w in weights.items()}
    broken = next((c.why for c in first.values() if c.why), "")
    if broken:
        return batches[0], {k: Kinks(ran=False, detail=broken, band=BAND) for k in weights}, {}
    dirty = sorted(set().union(*(c.rows for c in first.values())))
    unplaced = sum(c.unplaced for c in first.values())
    size = batches[0][0].shape[0]

    def stay(why: str) -> Chosen:
        return batches[0], {k: _record(c, c, "gate batch 0", [], why) for k, c in first.items()}, first

    if not dirty and not unplaced:
        return stay("")
    if unplaced:
        return stay(f"{unplaced} of the elements within rounding of a kink lie in tensors whose layout does not say "
                    "which sequence they belong to: the probe could not be moved")
    clean: list[int] = []
    if len(batches) > 1:
        counts = [census(truth, eager, w, batches[1]) for w in weights.values()]
        if not any(c.why or c.unplaced for c in counts):
            taken = set().union(*(c.rows for c in counts))
            clean = [r for r in range(size) if r not in taken]
    if not clean:
        return stay(f"no sequence of {'gate batch 1' if len(batches) > 1 else 'another gate batch (there is one)'} is "
                    "clear of kinks: the probe stays on gate batch 0, its kinks priced where they can be")
    # The first batch's clean rows keep their places; each dirty one takes the next clean row of gate batch 1, as far
    # as they go (a sequence is never used twice: the rest stay, and their kinks are priced).
    chosen = [(0, r) for r in range(size)]
    for r, c in zip(dirty, clean):
        chosen[r] = (1, c)
    x = torch.stack([batches[j][0][r] for j, r in chosen])
    y = torch.stack([batches[j][1][r] for j, r in chosen])
    moved = min(len(dirty), len(clean))
    probe = (f"gate batch 0 with {moved} of its {size} sequences replaced by clean ones of gate batch 1"
             + (f" ({len(dirty) - moved} more had none to take their place)" if moved < len(dirty) else ""))
    out, counts_at = {}, {}
    for k, w in weights.items():
        again = census(truth, eager, w, (x, y))
        why = "" if not again.near else (
            f"{again.near} elements still lie within rounding of a kink in the assembled batch" + (
                "" if moved < len(dirty) else ": this model's sequences are not independent"))
        out[k] = _record(again if not again.why else first[k], first[k], probe, [[j, r] for j, r in chosen], why)
        counts_at[k] = again if not again.why else Count()
    return (x, y), out, counts_at
