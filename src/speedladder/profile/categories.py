"""Where one step's time goes: every profiled operator in one category, the shares, and the regime they name.

Every operator's *self* time inside a step is put in one category by the
operator's name (or by the optimizer's scope it ran in); the time of the step
that no operator accounts for is the device waiting on the host. On a CPU the
"device" is the CPU itself: device time is CPU operator time, and the gaps are
Python, dispatch and autograd bookkeeping between operators. Pure functions of
the profiler's events: no torch.profiler here.
"""

from __future__ import annotations

from dataclasses import dataclass

STEP_MARK = "speedladder.step"  # the record_function around each profiled step

# The categories of one step; their shares add to 100%.
CATEGORIES: tuple[str, ...] = ("matmul", "attention", "elementwise & norm", "reductions & softmax", "optimizer",
                               "copies & H2D", "idle / host overhead", "other")
IDLE = "idle / host overhead"

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


@dataclass(frozen=True)
class OpTime:
    name: str
    category: str
    us: float  # self time, summed over the profiled steps
    calls: int
    floor_us: float  # the part that is fixed cost: min(self time, per-op floor) summed over its calls
    flops: int  # counted by the profiler for matmuls (0 where it does not count)
    bytes: int  # traffic of the innermost operators, counted from their recorded shapes
    bytes_us: float  # the self time of the calls whose bytes were counted


def breakdown(events: list, n_steps: int, step_us: float, device_time: bool, op_floor_us: float) -> dict:
    """Shares of one step by category, summing to 1, from the profiler's events.

    events: the FunctionEvents of the profiled steps (CPU-side events; on CUDA
    their self_device_time is the kernels each launched). step_us: wall time of
    the profiled steps together. op_floor_us: the fixed cost of one operator on
    this device (measured); on a CPU, each operator's time up to it is overhead.
    """
    ops: dict[str, OpTime] = {}
    for e in events:
        if e.name == STEP_MARK:
            continue
        t = float(getattr(e, "self_device_time_total", 0.0)) if device_time else float(e.self_cpu_time_total)
        if t <= 0:
            continue
        cat = _scope(e) or category(e.name)
        floor = 0.0 if device_time or cat == IDLE else min(t, op_floor_us)
        flops = int(getattr(e, "flops", 0) or 0)
        nbytes = _bytes(e) if cat in MEMORY_CATEGORIES else 0
        bytes_us = t if nbytes else 0.0
        old = ops.get(e.name)
        if old is None:
            ops[e.name] = OpTime(e.name, cat, t, 1, floor, flops, nbytes, bytes_us)
        else:
            # An op may run inside and outside the optimizer: it goes where most of its time is.
            ops[e.name] = OpTime(e.name, old.category if old.us >= t else cat, old.us + t, old.calls + 1,
                                 old.floor_us + floor, old.flops + flops, old.bytes + nbytes,
                                 old.bytes_us + bytes_us)
    by_cat = dict.fromkeys(CATEGORIES, 0.0)
    floor_cat = dict.fromkeys(CATEGORIES, 0.0)
    for o in ops.values():
        by_cat[o.category] += o.us
        floor_cat[o.category] += o.floor_us
    # What no operator's self time accounts for: the GPU waiting on the host, or (CPU) Python between ops.
    by_cat[IDLE] += max(step_us - sum(by_cat.values()), 0.0)
    # Kernels on several streams can overlap and add to more than the wall time: shares are of the sum.
    total = sum(by_cat.values()) or 1.0
    floors = sum(o.floor_us for o in ops.values())
    top = sorted(ops.values(), key=lambda o: o.us, reverse=True)
    mm_flops = sum(o.flops for o in ops.values() if o.category == "matmul")
    mm_us = by_cat["matmul"]
    mem = [o for o in ops.values() if o.category in MEMORY_CATEGORIES and o.bytes]
    mem_bytes, mem_us = sum(o.bytes for o in mem), sum(o.bytes_us for o in mem)
    return {
        # floor_ms: the part of a category's time that is each operator's fixed cost (CPU only).
        "categories": {c: {"ms": by_cat[c] / n_steps / 1e3, "share": by_cat[c] / total,
                           "floor_ms": floor_cat[c] / n_steps / 1e3} for c in CATEGORIES},
        "step_ms": total / n_steps / 1e3,
        "wall_step_ms": step_us / n_steps / 1e3,
        "ops_per_step": sum(o.calls for o in ops.values() if o.category != IDLE) / n_steps,
        # The fixed per-operator cost, summed: with the gaps, what a faster device would not shorten.
        "floor_share": floors / total,
        "ops_ms": {o.name: o.us / n_steps / 1e3 for o in top},
        "top_ops": [{"name": o.name, "category": o.category, "calls": o.calls // n_steps,
                     "ms_per_step": o.us / n_steps / 1e3, "share": o.us / total} for o in top[:15]],
        # Roofline context: what the matmuls achieved, and what the memory-bound operators moved per second.
        "matmul_tflops": mm_flops / (mm_us * 1e-6) / 1e12 if mm_us > 0 and mm_flops else None,
        "memory_gbps": mem_bytes / (mem_us * 1e-6) / 1e9 if mem_us > 0 else None,
        "memory_counted_share": mem_us / max(sum(by_cat[c] for c in MEMORY_CATEGORIES), 1e-9),
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


def regime(b: dict) -> tuple[str, str, dict[str, float]]:
    """The largest of three buckets of the step names the regime.

    overhead: the device waiting on the host, plus each operator's fixed cost
    (a CPU's dispatch floor); compute: matmuls and attention kernels beyond
    that floor; memory: every other operator (elementwise, norms, reductions,
    copies, the optimizer's element-wise update), whose speed is set by bytes
    moved, not FLOPs. "other" counts in none.
    """
    s = {c: v["share"] for c, v in b["categories"].items()}
    floor = b["floor_share"]
    compute = s["matmul"] + s["attention"]
    memory = s["elementwise & norm"] + s["reductions & softmax"] + s["copies & H2D"] + s["optimizer"]
    overhead = s[IDLE] + floor
    # The floor was counted inside each operator's category; take it out of compute and memory in proportion.
    busy = compute + memory
    if busy > 0:
        compute -= floor * compute / busy
        memory -= floor * memory / busy
    buckets = {"compute-bound": compute, "memory-bound": memory, "overhead-bound": overhead}
    name = max(buckets, key=buckets.get)
    evidence = (f"matmul+attention {compute:.0%}, memory-bound ops {memory:.0%} (elementwise & norm "
                f"{s['elementwise & norm']:.0%}, reductions {s['reductions & softmax']:.0%}, optimizer "
                f"{s['optimizer']:.0%}), host overhead {overhead:.0%} "
                f"({s[IDLE]:.0%} between ops + {floor:.0%} per-op floor, {b['ops_per_step']:.0f} ops/step)")
    return name, evidence, {"compute": compute, "memory": memory, "overhead": overhead}
