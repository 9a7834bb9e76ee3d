"""Profile a few training steps, break one step into categories and name its regime.

Measure -> classify -> fix -> re-measure: before any rung is tried, a few steps
of the baseline run under torch.profiler. Every operator's *self* time inside
a step is put in one category by the operator's name (or by the optimizer's
scope it ran in); the time of the step that no operator accounts for is the
device waiting on the host. On a CPU the "device" is the CPU itself: device
time is CPU operator time, and the gaps are Python, dispatch and autograd
bookkeeping between operators.

Profiling taxes what it watches, so it never shares a process with a timed
window: `run_in_child` runs it in a fresh spawned process, and the ladder's
timing starts after that process has ended.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from speedladder.measure import sync

STEP_MARK = "speedladder.step"  # the record_function around each profiled step
TRACE = "trace.json"
FILENAME = "profile.json"  # what `speedladder profile` writes; `run` keeps the profile inside results.json

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


# -- device facts measured on the spot --------------------------------------------------------


def _time(fn: Callable[[], object], device: torch.device, budget_s: float = 0.5, min_reps: int = 3,
          sample_s: float = 2e-3) -> float:
    """Median seconds of one call of fn, over samples of back-to-back calls synchronized at their ends.

    A sample runs enough calls to last about sample_s: in a training step the
    device runs kernels back to back, so a synchronization (tens of µs on a
    GPU) after every call would inflate small matmuls that never pay it.
    """
    fn()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    inner = max(1, min(1000, int(sample_s / max(time.perf_counter() - t0, 1e-9))))
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < budget_s and len(times) < 50):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync(device)
        times.append((time.perf_counter() - t0) / inner)
    times.sort()
    return times[len(times) // 2]


def op_floor_us(device: torch.device) -> float:
    """The fixed cost of one operator: an add of two one-element tensors."""
    a = torch.ones(1, device=device)
    b = torch.ones(1, device=device)
    return _time(lambda: torch.add(a, b), device, budget_s=0.2) * 1e6


def copy_gbps(device: torch.device, n_bytes: int) -> float:
    """Bytes per second of a large tensor copy (read + write): the memory-bound ceiling, measured here."""
    x = torch.empty(n_bytes // 4, device=device)
    y = torch.empty_like(x)
    return 2 * n_bytes / _time(lambda: y.copy_(x), device, budget_s=0.3) / 1e9


def matmul_shapes(cfg, batch_size: int, seq_len: int) -> list[tuple[str, int, int, int, int]]:
    """The forward matmuls of one step as (name, rows, inner, cols, count); backward does each twice over."""
    rows, c, h, nh, hd = batch_size * seq_len, cfg.n_embd, cfg.mlp_hidden, cfg.n_head, cfg.head_dim
    return [
        ("qkv", rows, c, 3 * c, cfg.n_layer), ("attn-proj", rows, c, c, cfg.n_layer),
        ("mlp-fc", rows, c, h, cfg.n_layer), ("mlp-proj", rows, h, c, cfg.n_layer),
        ("head", rows, c, cfg.vocab_size, 1),
        # The hand-written attention's two batched products, one per head: (T x hd) @ (hd x T) and back.
        ("scores", batch_size * nh * seq_len, hd, seq_len, cfg.n_layer),
        ("weighted-sum", batch_size * nh * seq_len, seq_len, hd, cfg.n_layer),
    ]


def _matmul_time(rows: int, inner: int, cols: int, device: torch.device, bf16: bool, budget_s: float) -> float:
    x = torch.randn(rows, inner, device=device)
    w = torch.randn(cols, inner, device=device)
    # Autocast as in the rung: the casts of fp32 inputs are part of what bf16 costs.
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        return _time(lambda: F.linear(x, w), device, budget_s=budget_s)


def matmul_facts(cfg, batch_size: int, seq_len: int, multiplier: int, device: torch.device,
                 ceiling_n: int, budget_s: float = 4.0) -> dict:
    """Throughput of this model's own matmul shapes in fp32 and bf16, at the batch and at multiplier x it.

    What the bf16 and batch-up predictions need and no datasheet gives: at
    width 256 the products are too small for bf16 or a bigger batch to pay.
    A shape too slow for the budget is left out (named in "skipped").
    """
    shapes = matmul_shapes(cfg, batch_size, seq_len)
    padded = -cfg.vocab_size % 64  # what pad-vocab would add to the head
    per_call = budget_s / (4 * len(shapes) + 2 * bool(padded) + 2)
    ceiling = {}
    for prec in ("fp32", "bf16"):
        t = _matmul_time(ceiling_n, ceiling_n, ceiling_n, device, prec == "bf16", per_call)
        ceiling[prec] = 2 * ceiling_n**3 / t / 1e12
    out: dict = {"ceiling_tflops": ceiling, "ceiling_n": ceiling_n, "shapes": [], "skipped": [],
                 "multiplier": multiplier}
    if padded:
        shapes.append(("head-padded", batch_size * seq_len, cfg.n_embd, cfg.vocab_size + padded, 1))
    for name, rows, inner, cols, count in shapes:
        flops = 2 * rows * inner * cols
        if flops * multiplier / (min(ceiling.values()) * 1e12) > per_call:
            out["skipped"].append(name)
            continue
        runs = (("fp32", rows, False), ("bf16", rows, True))
        if name != "head-padded":
            runs += (("fp32_k", rows * multiplier, False), ("bf16_k", rows * multiplier, True))
        try:
            times = {key: _matmul_time(r, inner, cols, device, bf16, per_call) * count for key, r, bf16 in runs}
        except RuntimeError as e:  # out of memory, e.g. GPT-2's head at the batch-up multiple on a smaller GPU
            if "out of memory" not in str(e).lower() and "can't allocate" not in str(e):
                raise
            out["skipped"].append(name)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        out["shapes"].append({"name": name, "rows": rows, "inner": inner, "cols": cols, "count": count,
                              **{f"{k}_ms": v * 1e3 for k, v in times.items()}})

    def total(key: str, names: tuple[str, ...] | None = None) -> float:
        return sum(s[f"{key}_ms"] for s in out["shapes"] if s["name"] != "head-padded"
                   and (names is None or s["name"] in names))

    # Time-weighted over the shapes (each counted as often as the step runs it), as they weigh in the step.
    t32, t16 = total("fp32"), total("bf16")
    out["bf16_speedup"] = t32 / t16 if t16 else None
    out["batch_gain"] = {p: multiplier * total(p) / total(f"{p}_k") if total(f"{p}_k") else None
                         for p in ("fp32", "bf16")}
    # The hand-written attention's share of the matmul time: what fused attention takes over.
    out["attention_fraction"] = {p: total(p, ("scores", "weighted-sum")) / total(p) if total(p) else 0.0
                                 for p in ("fp32", "bf16")}
    head = next((s for s in out["shapes"] if s["name"] == "head"), None)
    head_padded = next((s for s in out["shapes"] if s["name"] == "head-padded"), None)
    out["head_fraction"] = {p: head[f"{p}_ms"] / total(p) if head and total(p) else 0.0 for p in ("fp32", "bf16")}
    out["pad_vocab_speedup"] = ({p: head[f"{p}_ms"] / head_padded[f"{p}_ms"] for p in ("fp32", "bf16")}
                                if head and head_padded else None)
    return out


# -- the profile --------------------------------------------------------------------------------


def profile_step(step: Callable[[], object], device: torch.device, steps: int, warmup: int,
                 trace_path: Path | None = None) -> dict:
    """Warm up, then profile `steps` steps (each synchronized at its end) and break them down."""
    for _ in range(warmup):
        step()
    sync(device)
    activities = [ProfilerActivity.CPU]
    device_time = device.type == "cuda"
    if device_time:
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=True, with_flops=True) as prof:
        for _ in range(steps):
            with record_function(STEP_MARK):
                step()
                sync(device)
    events = list(prof.events())
    marks = [e for e in events if e.name == STEP_MARK]
    spans = [(e.time_range.start, e.time_range.end) for e in marks]
    inside = [e for e in events if e.name != STEP_MARK and e.device_type == torch.autograd.DeviceType.CPU
              and any(s <= e.time_range.start < t for s, t in spans)]
    step_us = sum(t - s for s, t in spans)
    floor = 0.0 if device_time else op_floor_us(device)
    b = breakdown(inside, len(spans), step_us, device_time, floor)
    b["op_floor_us"] = floor
    b["steps"] = len(spans)
    b["time_basis"] = ("CUDA kernel time per operator; idle is the GPU waiting on the host" if device_time else
                       "CPU operator time (a CPU is its own device); idle is Python, dispatch and autograd "
                       "bookkeeping between operators")
    sort = "self_device_time_total" if device_time else "self_cpu_time_total"
    b["top_table"] = prof.key_averages().table(sort_by=sort, row_limit=12, max_name_column_width=40)
    name, evidence, buckets = regime(b)
    b.update(regime=name, evidence=evidence, buckets=buckets)
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
        b["trace"] = trace_path.name
    return b


def profile_workload(run_cfg, rungs: tuple[str, ...], trace_path: Path | None) -> dict:
    """Build the workload of a RunConfig, profile the spec of `rungs` (the baseline when empty)."""
    from speedladder.data import BatchStream
    from speedladder.ladder import prepare
    from speedladder.measure import stepper
    from speedladder.rungs import compose
    from speedladder.step import TrainStep, matmul_precision

    work = prepare(run_cfg)
    cfg = work.cfg
    spec = compose(rungs, work.base_spec, work.env)
    torch.manual_seed(cfg.seed)
    with matmul_precision(spec):
        step = TrainStep(spec, cfg.model, work.init, work.device, cfg.lr)
        stream = BatchStream(work.corpus, spec.batch_size, spec.seq_len, work.device, cfg.seed)
        warmup = max(cfg.warmup, 3) + (5 if spec.compile else 0)
        b = profile_step(stepper(step, stream), work.device, cfg.profile.steps, warmup, trace_path)
        del step
        b["spec"] = spec.to_dict()
        b["rungs"] = list(rungs)
        b["device_type"] = work.device.type
        b["tokens_per_step"] = spec.tokens_per_step
        b["params"] = work.params
        b["model"] = dataclasses.asdict(cfg.model)
        cuda = work.device.type == "cuda"
        b["matmuls"] = matmul_facts(cfg.model, spec.batch_size, spec.seq_len, cfg.batch_multiplier, work.device,
                                    ceiling_n=4096 if cuda else 512)
        b["copy_gbps"] = copy_gbps(work.device, (1 << 30) if cuda else (1 << 26))
    return b


def run_in_child(run_cfg, rungs: tuple[str, ...] = (), trace_path: Path | None = None,
                 timeout_s: float = 900.0) -> dict:
    """Profile in a fresh Python process: nothing of the profiler stays in the one that times.

    A plain subprocess, not multiprocessing: it works whatever the parent's
    __main__ is (a script, a notebook, pytest). Its stderr (the profiler's own
    chatter) is kept and shown only when it fails.
    """
    with tempfile.TemporaryDirectory(prefix="speedladder-profile-") as tmp:
        request, answer = Path(tmp) / "request.pkl", Path(tmp) / "profile.json"
        request.write_bytes(pickle.dumps((run_cfg, tuple(rungs), str(trace_path) if trace_path else None)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_SRC, os.environ.get("PYTHONPATH")]))}
        try:
            proc = subprocess.run([sys.executable, "-m", "speedladder.profile", str(request), str(answer)],
                                  check=False, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the profiling process took longer than {timeout_s:.0f} s") from None
        if proc.returncode != 0 or not answer.exists():
            lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip() and not ln.startswith("USDT")]
            raise RuntimeError(lines[-1] if lines else f"the profiling process exited with {proc.returncode}")
        return json.loads(answer.read_text())


# This package's source folder: the child imports the same speedladder as the parent.
_SRC = str(Path(__file__).resolve().parent.parent)


def _main(argv: list[str]) -> int:
    request, answer = argv
    run_cfg, rungs, trace = pickle.loads(Path(request).read_bytes())
    b = profile_workload(run_cfg, rungs, Path(trace) if trace else None)
    Path(answer).write_text(json.dumps(b))
    return 0


def spec_of(b: dict):
    """The StepSpec a saved profile was taken of."""
    from speedladder.rungs import StepSpec

    return StepSpec.from_dict(b["spec"])


def valid_trace(path: Path) -> int:
    """Events in a Chrome/Perfetto trace file; raises if it is not one."""
    data = json.loads(Path(path).read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    return len(events)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
