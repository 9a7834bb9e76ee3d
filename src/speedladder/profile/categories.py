"""Where one step's time goes: every profiled operator in one category, the shares, and the regime they name.

Every operator's *self* time inside a step is put in one category by the
operator's name (or by the optimizer's scope it ran in); the time of the step
that no operator accounts for is the device waiting on the host. On a CPU the
"device" is the CPU itself: device time is CPU operator time, and the gaps are
Python, dispatch and autograd bookkeeping between operators. On CUDA the host
and the device run side by side: the step is about the larger of the two, and
the regime says which (`split_regime`). Pure functions of the profiler's
events: no torch.profiler here.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from speedladder.profile import quartiles

STEP_MARK = "speedladder.step"  # the record_function around each profiled step

# The categories of one step; their shares add to 100%.
CATEGORIES: tuple[str, ...] = ("matmul", "attention", "elementwise & norm", "reductions & softmax", "optimizer",
                               "copies & H2D", "idle / host overhead", "other")
IDLE = "idle / host overhead"
# The buckets the categories add up to (buckets()), by which the regime is named: a profile's `buckets` keys.
COMPUTE, MEMORY, OVERHEAD = "compute", "memory", "overhead"

# Operator names by category (aten names without "aten::", and inductor kernel name prefixes).
_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot", "_scaled_mm",
           "mkldnn_linear", "_addmm_activation"}
_ATTENTION = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_flash_attention_for_cpu", "_flash_attention_forward", "_flash_attention_backward",
              "_efficient_attention_forward", "_efficient_attention_backward",
              "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
              "_scaled_dot_product_cudnn_attention_backward",
              "_scaled_dot_product_flash_attention_for_cpu_backward"}
_REDUCTION = {"sum", "mean", "max", "amax", "min", "amin", "norm", "linalg_vector_norm", "softmax", "_softmax",
              "log_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
              "cross_entropy", "nll_loss", "nll_loss_nd", "nll_loss_forward", "nll_loss_backward", "argmax",
              "cumsum", "var", "std", "var_mean", "logsumexp", "prod", "_foreach_norm"}
_COPY = {"copy_", "to", "_to_copy", "clone", "contiguous", "cat", "stack", "_copy_from", "index_put_",
         "pin_memory", "_pin_memory", "Memcpy HtoD", "Memcpy DtoH", "Memcpy DtoD", "fill_", "zero_", "zeros",
         "zeros_like", "ones", "full", "copy"}
# Ops that only make views or allocate: no arithmetic and no traffic, so their time is host overhead.
_VIEW = {"view", "reshape", "_reshape_alias", "_unsafe_view", "t", "transpose", "permute", "expand", "as_strided",
         "slice", "select", "split", "split_with_sizes", "unsqueeze", "squeeze", "detach", "detach_", "alias",
         "empty", "empty_strided", "empty_like", "narrow", "unbind", "chunk", "resolve_conj", "resolve_neg",
         "_has_compatible_shallow_copy_type", "lift_fresh", "result_type", "is_nonzero", "item",
         "_local_scalar_dense", "set_", "arange", "numpy_T", "unflatten", "flatten", "expand_as", "view_as",
         "_unsafe_split", "tensor_split"}


def category(name: str) -> str:
    """The category of one profiler event by its name; anything not an operator is host overhead."""
    if name.startswith("Optimizer."):
        return "optimizer"
    if name.startswith(("triton_red", "triton_per")):
        return "reductions & softmax"
    if name.startswith(("triton_", "cpp_fused", "CompiledFunction", "Torch-Compiled Region")) or (
            "CompiledFxGraph" in name):
        # Inductor's fused kernels: on CUDA named Triton kernels, on a CPU C++ loops run inside the compiled graph's
        # call ("## Call CompiledFxGraph ..."). Its matmuls still show up as aten::mm/addmm of their own.
        return "elementwise & norm"
    if name.startswith(("Memcpy", "Memset")):
        return "copies & H2D"
    if not name.startswith("aten::"):
        return IDLE  # record_functions, autograd engine nodes, Python: bookkeeping between operators
    op = name[len("aten::"):]
    if op in _MATMUL:
        return "matmul"
    if op in _ATTENTION or "attention" in op:
        return "attention"
    if op in _REDUCTION:
        return "reductions & softmax"
    if op in _COPY or op.startswith("_foreach_copy"):
        return "copies & H2D"
    if op in _VIEW:
        return IDLE
    return "elementwise & norm"  # add, mul, relu, gelu, layer_norm, dropout, embedding, masked_fill, ...


_ITEMSIZE = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4, "bool": 1,
             "unsigned char": 1, "signed char": 1, "short int": 2}
MEMORY_CATEGORIES = ("elementwise & norm", "reductions & softmax", "copies & H2D")


def _bytes(e) -> int:
    """Bytes an operator moves, roughly: every tensor input read once, an output the size of the largest written.

    Counted only for innermost operators (an op with operator children would count its children's traffic
    again); 0 where the profiler recorded no shapes.
    """
    if any(c.name.startswith("aten::") for c in e.cpu_children):
        return 0
    sizes = []
    for shape, dtype in zip(e.input_shapes or [], getattr(e, "input_dtypes", None) or []):
        if isinstance(shape, list) and shape and all(isinstance(d, int) for d in shape) and dtype in _ITEMSIZE:
            n = 1
            for d in shape:
                n *= d
            sizes.append(n * _ITEMSIZE[dtype])
    return sum(sizes) + max(sizes) if sizes else 0


@dataclass
class OpTime:
    """One operator name over all profiled steps."""

    name: str
    us_by_category: dict[str, float]  # self time, summed over the steps, by the category each call was put in
    calls: int
    flops: int  # counted by the profiler for matmuls (0 where it does not count)
    bytes: int  # traffic of the innermost operators, counted from their recorded shapes
    bytes_us: float  # the self time of the calls whose bytes were counted

    @property
    def us(self) -> float:
        return sum(self.us_by_category.values())

    @property
    def category(self) -> str:
        """Where most of its time went (an op may run inside and outside the optimizer or a matmul)."""
        return max(self.us_by_category, key=self.us_by_category.__getitem__)


@dataclass
class StepTimes:
    """One profiled step by category, in microseconds."""

    wall_us: float
    us: dict[str, float]  # per category; IDLE includes the time no operator accounts for
    floor_us: dict[str, float]  # per category, the part that is each operator's fixed cost (CPU only)
    ops: int  # operator calls that carry a fixed cost: every call not in IDLE
    op_us: dict[str, float]  # per operator name


def step_times(events: list, wall_us: float, device_time: bool, op_floor_us: float,
               ops: dict[str, OpTime], step_us: float | None = None) -> StepTimes:
    """One step's events by category; each operator's calls are also added to `ops` (all steps together).

    step_us: the step that idle is counted against, where it is not the profiled step's wall (on CUDA, the
    unprofiled step: the profiler slows the host, not the kernels, so its wall would overstate the device's wait).

    Each call is put in its own category (by its scope, else its name): a view op
    inside a matmul is the matmul's, the same op elsewhere is host overhead.
    Counting by call, not by name, keeps the count of operators per step the
    same for the same workload (docs/profile.md).
    """
    us = dict.fromkeys(CATEGORIES, 0.0)
    floor_us = dict.fromkeys(CATEGORIES, 0.0)
    op_us: dict[str, float] = {}
    n_ops = 0
    for e in events:
        if e.name == STEP_MARK:
            continue
        t = float(getattr(e, "self_device_time_total", 0.0)) if device_time else float(e.self_cpu_time_total)
        if t <= 0:
            continue
        cat = _scope(e) or category(e.name)
        us[cat] += t
        op_us[e.name] = op_us.get(e.name, 0.0) + t
        if cat != IDLE:
            n_ops += 1
            floor_us[cat] += 0.0 if device_time else min(t, op_floor_us)
        nbytes = _bytes(e) if cat in MEMORY_CATEGORIES else 0
        o = ops.setdefault(e.name, OpTime(e.name, {}, 0, 0, 0, 0.0))
        o.us_by_category[cat] = o.us_by_category.get(cat, 0.0) + t
        o.calls += 1
        o.flops += int(getattr(e, "flops", 0) or 0)
        o.bytes += nbytes
        o.bytes_us += t if nbytes else 0.0
    # What no operator's self time accounts for: the GPU waiting on the host, or (CPU) Python between ops.
    us[IDLE] += max((wall_us if step_us is None else step_us) - sum(us.values()), 0.0)
    return StepTimes(wall_us, us, floor_us, n_ops, op_us)


def breakdown(steps: list[list], walls_us: list[float], device_time: bool, op_floor_us: float,
              busy_us: list[float] | None = None, step_us: float | None = None) -> dict:
    """The median step by category (shares summing to 1), each category's spread across the steps, the operators.

    steps: per profiled step, the FunctionEvents that started in it (CPU-side
    events; on CUDA their self_device_time is the kernels each launched).
    walls_us: each step's wall time. op_floor_us: the fixed cost of one
    operator on this device (measured); on a CPU, each operator's time up to it
    is overhead. Each category's time is its median across the steps, so one
    disturbed step does not move the breakdown; the steps themselves are kept
    in "per_step". busy_us (CUDA): each step's device busy time, the union of its kernels' intervals; step_us
    (CUDA): the unprofiled step, which idle is counted against (step_times).
    """
    ops: dict[str, OpTime] = {}
    per = [step_times(evs, wall, device_time, op_floor_us, ops, step_us)
           for evs, wall in zip(steps, walls_us, strict=True)]
    n = len(per)
    med = quartiles.medians([p.us for p in per])
    floor_med = quartiles.medians([p.floor_us for p in per])
    # Kernels on several streams can overlap and add to more than the wall time: shares are of the sum.
    total = sum(med.values()) or 1.0
    shares = [{c: p.us[c] / (sum(p.us.values()) or 1.0) for c in CATEGORIES} for p in per]
    categories = {c: {"ms": med[c] / 1e3, "share": med[c] / total, "floor_ms": floor_med[c] / 1e3,
                      "ms_iqr": [v / 1e3 for v in quartiles.iqr([p.us[c] for p in per])],
                      "share_iqr": quartiles.iqr([s[c] for s in shares])} for c in CATEGORIES}
    walls = [p.wall_us / 1e3 for p in per]
    per_step = [{"wall_ms": p.wall_us / 1e3, "ops": p.ops, "ms": {c: v / 1e3 for c, v in p.us.items()},
                 "floor_ms": {c: v / 1e3 for c, v in p.floor_us.items()}} for p in per]
    for p, busy in zip(per_step, busy_us or [], strict=False):
        p["device_ms"] = busy / 1e3
    return {
        # floor_ms: the part of a category's time that is each operator's fixed cost (CPU only).
        "categories": categories,
        "step_ms": total / 1e3,
        "wall_step_ms": statistics.median(walls),
        "ops_per_step": statistics.median(p.ops for p in per),
        # The fixed per-operator cost, summed: with the gaps, what a faster device would not shorten.
        "floor_share": sum(floor_med.values()) / total,
        "per_step": per_step,
        "spread_basis": quartiles.SPREAD_BASIS,
        "outlier_steps": quartiles.outliers(walls),
        "outlier_rule": quartiles.OUTLIER_RULE,
        **({"device_ms": statistics.median(busy_us) / 1e3} if busy_us else {}),
        **_operators(ops, per, n, med, total),
    }


def _operators(ops: dict[str, OpTime], per: list[StepTimes], n: int, med: dict[str, float], total: float) -> dict:
    """Every operator's median time per step, the largest ones, and the roofline figures."""
    op_med = quartiles.medians([p.op_us for p in per])
    top = sorted(ops.values(), key=lambda o: op_med.get(o.name, 0.0), reverse=True)
    mm_flops = sum(o.flops for o in ops.values() if o.category == "matmul") / n
    mem = [o for o in ops.values() if o.bytes]  # bytes are counted only for calls in a memory category
    mem_bytes, mem_us = sum(o.bytes for o in mem), sum(o.bytes_us for o in mem)
    mem_all = sum(p.us[c] for p in per for c in MEMORY_CATEGORIES)
    return {
        "ops_ms": {o.name: op_med.get(o.name, 0.0) / 1e3 for o in top},
        "top_ops": [{"name": o.name, "category": o.category, "calls": o.calls // n,
                     "ms_per_step": op_med.get(o.name, 0.0) / 1e3, "share": op_med.get(o.name, 0.0) / total}
                    for o in top[:15]],
        # Roofline context: what the matmuls achieved, and what the memory-bound operators moved per second.
        "matmul_tflops": mm_flops / (med["matmul"] * 1e-6) / 1e12 if med["matmul"] > 0 and mm_flops else None,
        "memory_gbps": mem_bytes / (mem_us * 1e-6) / 1e9 if mem_us > 0 else None,
        "memory_counted_share": mem_us / max(mem_all, 1e-9),
    }


def _scope(e) -> str | None:
    """The category an event takes from what it runs inside, if any.

    Anything under the optimizer's step is the optimizer's; anything under a
    matmul or attention operator (addmm copying its bias into the output, the
    clone a matmul makes of a non-contiguous input) is part of that operator.
    """
    inherited = None
    p = e.cpu_parent
    while p is not None:
        if p.name.startswith("Optimizer."):
            return "optimizer"
        if inherited is None and p.name.startswith("aten::") and category(p.name) in ("matmul", "attention"):
            inherited = category(p.name)
        p = p.cpu_parent
    return inherited


# -- regime ---------------------------------------------------------------------------------

REGIMES = ("compute-bound", "memory-bound", "overhead-bound")


def buckets(shares: dict[str, float], floor_share: float) -> dict[str, float]:
    """The compute, memory and overhead buckets of a step, from its category shares and its fixed-cost share.

    overhead: the device waiting on the host, plus each operator's fixed cost
    (a CPU's dispatch floor); compute: matmuls and attention kernels beyond
    that floor; memory: every other operator (elementwise, norms, reductions,
    copies, the optimizer's element-wise update), whose speed is set by bytes
    moved, not FLOPs. "other" counts in none.
    """
    s = shares
    compute = s["matmul"] + s["attention"]
    memory = s["elementwise & norm"] + s["reductions & softmax"] + s["copies & H2D"] + s["optimizer"]
    overhead = s[IDLE] + floor_share
    # The floor was counted inside each operator's category; take it out of compute and memory in proportion.
    busy = compute + memory
    if busy > 0:
        compute -= floor_share * compute / busy
        memory -= floor_share * memory / busy
    return {COMPUTE: compute, MEMORY: memory, OVERHEAD: overhead}


def step_buckets(b: dict) -> list[dict[str, float]]:
    """The buckets of each profiled step alone (b["per_step"], as breakdown() keeps them)."""
    out = []
    for p in b.get("per_step") or []:
        total = sum(p["ms"].values()) or 1.0
        out.append(buckets({c: v / total for c, v in p["ms"].items()}, sum(p["floor_ms"].values()) / total))
    return out


def host_and_device(b: dict) -> tuple[float, float] | None:
    """(host ms, device ms) of a step whose host and device run side by side (CUDA), None where they are one (a CPU,
    or a file from before they were kept apart)."""
    host, device = b.get("host_ms"), b.get("device_ms")
    return (host, device) if host is not None and device is not None else None


def split_regime(host_ms: float, device_ms: float, bk: dict[str, float]) -> str:
    """A step that costs about the larger of its host's and its device's time: overhead-bound when the host takes
    longer (the device waits on it, and faster kernels buy nothing), else the device's larger bucket."""
    if host_ms >= device_ms:
        return f"{OVERHEAD}-bound"
    return f"{COMPUTE}-bound" if bk[COMPUTE] >= bk[MEMORY] else f"{MEMORY}-bound"


def regime(b: dict) -> tuple[str, str, dict[str, float]]:
    """The regime of the (median) step: (regime, evidence line, buckets). On a CPU, the largest of three buckets; on
    CUDA, whether the host or the device takes longer, then the device's larger bucket (split_regime)."""
    s = {c: v["share"] for c, v in b["categories"].items()}
    floor = b["floor_share"]
    bk = buckets(s, floor)
    sides = host_and_device(b)
    name = split_regime(*sides, bk) if sides else f"{max(bk, key=bk.__getitem__)}-bound"
    rng = {k: quartiles.iqr([p[k] for p in step_buckets(b)]) for k in bk} if b.get("per_step") else {}

    def show(k: str) -> str:  # a bucket's share, and the quartiles of each step's own share where kept
        return f"{bk[k]:.0%}" + (f" (steps {rng[k][0]:.0%}–{rng[k][1]:.0%})" if k in rng else "")

    ops = f", {b['ops_per_step']:.0f} ops/step" if b.get("ops_per_step") is not None else ""
    memory = (f"memory-bound ops {show('memory')} (elementwise & norm {s['elementwise & norm']:.0%}, reductions "
              f"{s['reductions & softmax']:.0%}, optimizer {s['optimizer']:.0%}, copies {s['copies & H2D']:.0%})")
    if sides:
        host, device = sides
        evidence = (f"host {host:.1f} ms a step against device {device:.1f} ms "
                    f"({'host' if host >= device else 'device'}-bound): matmul+attention {show('compute')}, {memory}, "
                    f"device idle {show('overhead')} of the unprofiled step" + (f" ({ops[2:]})" if ops else ""))
    else:
        evidence = (f"matmul+attention {show('compute')}, {memory}, host overhead {show('overhead')} "
                    f"({s[IDLE]:.0%} between ops + {floor:.0%} per-op floor{ops})")
    return name, evidence, bk


def _split_borderline(host: float, device: float, bk: dict[str, float], per: list[dict[str, float]]) -> list[str]:
    """On CUDA: host and device within MIN_MARGIN of the larger (either could bound the step), or, device-bound,
    compute and memory inside their spread (spread.borderline on those two)."""
    if abs(host - device) < quartiles.MIN_MARGIN * max(host, device):
        work = COMPUTE if bk[COMPUTE] >= bk[MEMORY] else MEMORY
        return [OVERHEAD, work] if host >= device else [work, OVERHEAD]
    if host >= device:
        return []
    keys = (COMPUTE, MEMORY)
    return quartiles.borderline({k: bk[k] for k in keys}, [{k: p[k] for k in keys} for p in per])


def classify(b: dict) -> dict:
    """The regime of the median step, and whether its margin over the runner-up is inside the spread (on CUDA: host
    against device first, _split_borderline).

    Returns the fields the profile keeps: regime (one of REGIMES, as ever),
    evidence, buckets, bucket_iqr, unsteady (the steps' wall times spread widely:
    a busy machine, said in the notes), starved (a multi-threaded step's threads
    waited too long for a core), borderline (the two regimes the margin
    cannot tell apart, or empty) and regime_label ("borderline (compute /
    memory)" or the regime). The rules are in profile/quartiles.py.
    """
    name, evidence, bk = regime(b)
    per = step_buckets(b)
    steps = b.get("per_step") or []
    walls = [p["wall_ms"] for p in steps]
    starved = quartiles.starved([p["wait_share"] for p in steps if "wait_share" in p], b.get("threads"))
    sides = host_and_device(b)
    pair = _split_borderline(*sides, bk, per) if sides else quartiles.borderline(bk, per, starved)
    return {"regime": name, "evidence": evidence, "buckets": bk,
            "bucket_iqr": {k: quartiles.iqr([p[k] for p in per]) for k in bk} if per else {},
            "unsteady": quartiles.unsteady(walls), "starved": starved,
            "borderline": [f"{k}-bound" for k in pair],
            "regime_label": f"borderline ({pair[0]} / {pair[1]})" if pair else name}
