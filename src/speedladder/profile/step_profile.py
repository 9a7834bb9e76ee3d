"""Profile a few training steps in a child process, and break them down (profile.categories).

Measure -> classify -> fix -> re-measure: before any rung is tried, a few steps
of the baseline run under torch.profiler. Profiling taxes what it watches, so
it never shares a process with a timed window (docs/measurement.md, rule 5):
`run_in_child` runs it in a fresh process, and the ladder's timing starts after
that process has ended.
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from speedladder import subproc
from speedladder.errors import one_line
from speedladder.measure import counters
from speedladder.measure.devicemem import sync
from speedladder.measure.microbench import ceiling_side, copy_gbps, matmul_facts, op_floor_us
from speedladder.measure.timer import stepper
from speedladder.models.user import LIVE
from speedladder.profile.categories import STEP_MARK, breakdown, classify
from speedladder.rungs import compose
from speedladder.spec import StepSpec
from speedladder.step.train_step import matmul_precision
from speedladder.step.workload import prepare

TRACE = "trace.json"
FILENAME = "profile.json"  # what `speedladder profile` writes; `run` keeps the profile inside results.json


def _copy_dtypes(prof: profile, events: list) -> None:
    """The input dtypes of each CPU operator, which the memory-bound operators' bytes are counted from. torch 2.11
    (the GPU machine's) records them on the profiler's kineto events but not on the FunctionEvents built from
    them: copied over by correlation id, where the names agree (else none, and no bytes are counted)."""
    if not events or hasattr(events[0], "input_dtypes"):
        return
    kineto: dict[int, tuple[str, list[str]]] = {}
    assert prof.profiler is not None and prof.profiler.kineto_results is not None  # prof.events() read them
    for k in prof.profiler.kineto_results.events():
        if k.device_type() == torch.autograd.DeviceType.CPU:
            kineto.setdefault(k.correlation_id(), (k.name(), k.dtypes()))
    for e in events:
        name, dtypes = kineto.get(e.id, (None, None))
        e.input_dtypes = dtypes if name == e.trace_name else None


def profile_step(step: Callable[[], object], device: torch.device, steps: int, warmup: int,
                 trace_path: Path | None = None) -> dict:
    """Warm up, then profile `steps` steps (each synchronized at its end) and break them down step by step.

    On CUDA the host and the device are timed apart: before the profiler starts (its tax outlives it), `unprofiled`
    times the host's part of a step and the step itself; under the profiler each step's device busy time is the
    union of its kernels. The categories' idle is the device's wait in the unprofiled step.
    """
    for _ in range(warmup):
        step()
    sync(device)
    activities = [ProfilerActivity.CPU]
    device_time = device.type == "cuda"
    if device_time:
        activities.append(ProfilerActivity.CUDA)
    timed = unprofiled(step, lambda: sync(device), steps) if device_time else None
    faults, waits = [], []
    with profile(activities=activities, record_shapes=True, with_flops=True) as prof:
        for _ in range(steps):
            before, wait = _minor_faults(), _run_queue_wait_s()
            with record_function(STEP_MARK):
                step()
                sync(device)
            faults.append(_minor_faults() - before)
            after = _run_queue_wait_s()
            waits.append(None if wait is None or after is None else after - wait)
    events = list(prof.events())
    _copy_dtypes(prof, events)
    spans = host_spans(events)
    if len(spans) != steps:  # a profile's steps are the steps that ran, once each
        raise RuntimeError(f"the profiler recorded {len(spans)} step ranges on the host for {steps} profiled steps")
    floor = 0.0 if device_time else op_floor_us(device)
    busy = device_busy_us(events, spans) if device_time else None
    b = breakdown(step_events(events, spans), [t - s for s, t in spans], device_time, floor, busy,
                  timed["step_ms"] * 1e3 if timed else None)
    if timed is not None:
        host, device_ms, step_ms = timed["host_ms"], b["device_ms"], timed["step_ms"]
        # What did not overlap: the unprofiled step beyond the larger of its host's and its device's time.
        b.update(host_ms=host, timed_step_ms=step_ms, serial_ms=max(step_ms - max(host, device_ms), 0.0))
    # The intra-op threads a CPU step asks for; None elsewhere (a GPU step's host time is not its device time).
    b["threads"] = torch.get_num_threads() if device.type == "cpu" else None
    for p, n, w in zip(b["per_step"], faults, waits, strict=False):
        p["minor_faults"] = n  # pages the kernel mapped for the step: a cost that can make one step an outlier
        if w is not None:
            # The time this process's threads were ready to run but waited for a core another process held, over
            # the core time the step asked for (wall x threads).
            p["wait_share"] = w / max(p["wall_ms"] / 1e3 * (b["threads"] or 1), 1e-9)
    b["op_floor_us"] = floor
    b["steps"] = len(spans)
    b["time_basis"] = ("CUDA kernel time per operator; idle is the GPU waiting on the host in the unprofiled step"
                       if device_time else
                       "CPU operator time (a CPU is its own device); idle is Python, dispatch and autograd "
                       "bookkeeping between operators")
    sort = "self_device_time_total" if device_time else "self_cpu_time_total"
    b["top_table"] = prof.key_averages().table(sort_by=sort, row_limit=12, max_name_column_width=40)
    b.update(classify(b))
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
        b["trace"] = trace_path.name
    return b


def unprofiled(step: Callable[[], object], sync_device: Callable[[], object], steps: int) -> dict[str, float]:
    """A step's host time and the step itself, with no profiler running (ms).

    host_ms: the median time a step takes to return, each step synchronized after it: on CUDA the call returns once
    its work is queued, so this is the host's part alone (Python, dispatch, launches, the batch), with the device
    never making it wait. step_ms: as many steps back to back, one synchronization after the last, per step: what a
    timed window sees, the host running ahead of the device.
    """
    hosts = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        hosts.append(time.perf_counter() - start)
        sync_device()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync_device()
    return {"host_ms": statistics.median(hosts) * 1e3, "step_ms": (time.perf_counter() - start) / steps * 1e3}


def host_spans(events: Iterable) -> list[tuple[float, float]]:
    """The profiled steps (us): the host's STEP_MARK ranges only. On CUDA the profiler records a record_function
    range twice, on the host and again on the device (a GPU user annotation over the kernels it launched); taking
    both made two half-steps of every step."""
    return sorted((e.time_range.start, e.time_range.end) for e in events
                  if e.name == STEP_MARK and e.device_type == torch.autograd.DeviceType.CPU)


def step_events(events: Iterable, spans: list[tuple[float, float]]) -> list[list]:
    """Each step's host-side events (operators and ranges, the step marks left out), by the step they started in."""
    per_step: list[list] = [[] for _ in spans]
    for e in events:
        if e.name == STEP_MARK or e.device_type != torch.autograd.DeviceType.CPU:
            continue
        i = bisect.bisect_right(spans, (e.time_range.start, float("inf"))) - 1  # the last step starting before it
        if i >= 0 and e.time_range.start < spans[i][1]:
            per_step[i].append(e)
    return per_step


def is_device_work(e) -> bool:
    """A device event that is work (a kernel, a copy, a memset), not a range marking some (the device-side copy of a
    record_function: the step's, the optimizer's)."""
    return (e.device_type != torch.autograd.DeviceType.CPU and not getattr(e, "is_user_annotation", False)
            and e.name != STEP_MARK and not e.name.startswith("Optimizer."))


def busy_us(intervals: Iterable[tuple[float, float]], start: float, end: float) -> float:
    """How long at least one interval covers within [start, end]: kernels that overlap (several streams) are counted
    once, so the result is never more than the span."""
    total, reach = 0.0, start
    for lo, hi in sorted(intervals):
        lo, hi = max(lo, reach), min(hi, end)
        if hi > lo:
            total += hi - lo
        reach = max(reach, hi)
    return total


def device_busy_us(events: Iterable, spans: list[tuple[float, float]]) -> list[float]:
    """Each step's device busy time (us): the union of the intervals of the device work inside its host span (each
    step is synchronized before its span ends, so its kernels run inside it)."""
    work = [(e.time_range.start, e.time_range.end) for e in events if is_device_work(e)]
    return [busy_us([w for w in work if w[1] > s and w[0] < t], s, t) for s, t in spans]


def _run_queue_wait_s() -> float | None:
    """Seconds this process's threads have waited, runnable, for a core (Linux schedstat); None elsewhere."""
    total = 0
    try:
        for task in Path("/proc/self/task").iterdir():
            total += int((task / "schedstat").read_text().split()[1])  # on-cpu ns, run-queue wait ns, slices
    except (OSError, IndexError, ValueError):  # not Linux, or a thread ended while read: no figure this step
        return None
    return total / 1e9


def _minor_faults() -> int:
    """Minor page faults of this process so far (0 where the platform does not count them)."""
    if sys.platform == "win32":
        return 0
    import resource  # Unix only

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def profile_workload(run_cfg, keys: list[tuple[str, ...]], traces: list[str | None], facts: bool = True) -> list[dict]:
    """Build the workload of a RunConfig once, and profile the spec of each key's rungs (the baseline when
    empty), one after the other; a key that failed has {"error": ...} instead. facts: also measure the
    microbenchmarks the predictions need (matmul_facts, copy_gbps; ~4 s), which a profile taken to explain a
    miss does without. traces: where each key's Chrome trace goes (None: none)."""
    work = prepare(run_cfg)
    out: list[dict] = []
    for rungs, trace in zip(keys, traces, strict=True):
        try:
            out.append(_profile_spec(work, tuple(rungs), Path(trace) if trace else None, facts))
        except Exception as e:  # noqa: BLE001 -- this key's error is its answer; the others still run
            out.append({"error": one_line(e)})
        gc.collect()
        torch.compiler.reset()  # each spec compiles afresh, as in a process of its own
    return out


def _profile_spec(work, rungs: tuple[str, ...], trace_path: Path | None, facts: bool) -> dict:
    cfg = work.cfg
    spec = compose(rungs, work.base_spec, work.env)
    torch.manual_seed(cfg.run.seed)
    with matmul_precision(spec):
        counters.clear()
        loaded = counters.compiled_modules() if spec.compile else 0
        step = work.step(spec)
        run = stepper(step, work.stream(spec))
        run()  # the first step: a compiled step compiles every graph it needs here
        first_graphs = counters.compile_count()
        warmup = max(cfg.run.timing.warmup or 0, 3) + (5 if spec.compile else 0)
        b = profile_step(run, work.device, cfg.run.profile.steps, warmup - 1, trace_path)
        if spec.compile:
            b["compiler"] = compiler_facts(first_graphs, loaded)
        del step, run
        cuda = work.device.type == "cuda"
        # The matmul facts need the architecture in our GPT's terms (ours, Hugging Face GPT-2); for any other
        # there are none, and the predictions that need them say so (profile/predict.py).
        shapes = work.model.shapes
        b.update(spec=spec.to_dict(), rungs=list(rungs), device_type=work.device.type,
                 tokens_per_step=spec.tokens_per_step, params=work.params,
                 model=dataclasses.asdict(shapes) if shapes else None,
                 matmuls=matmul_facts(shapes, spec.batch_size, spec.seq_len, cfg.run.batch_multiplier,
                                      work.device, ceiling_n=ceiling_side(work.device)) if shapes and facts else {},
                 copy_gbps=copy_gbps(work.device, (1 << 30) if cuda else (1 << 26)) if facts else None)
    return b


def compiler_facts(first_graphs: int, loaded: int) -> dict:
    """What the compiler did for a compiled spec, read after its warm-up: the graphs it compiled, those compiled after
    the first step (recompiles), its graph breaks (by reason), and the kernel calls in its generated code, each graph
    run once a step (counters.kernel_calls; None where that code could not be read)."""
    breaks = counters.graph_breaks()
    graphs = counters.compile_count()
    return {"graphs": graphs, "recompiles": graphs - first_graphs, "graph_breaks": sum(breaks.values()),
            "break_reasons": dict(sorted(breaks.items(), key=lambda kv: -kv[1])[:3]),
            "kernel_calls": counters.kernel_calls(loaded)}


def profiles_in_child(run_cfg, keys: list[tuple[str, ...]], timeout_s: float, trace_path: Path | None = None,
                      facts: bool = True, traces: list[Path | None] | None = None) -> list[dict]:
    """Profile the specs of several keys one after the other in one fresh Python process: nothing of the
    profiler stays in the one that times, and the process, the workload and the compiler start once.

    timeout_s is each key's; a key that failed has {"error": ...} instead. trace_path: the first key's trace;
    traces: each key's (None: none).
    """
    if (run_cfg.model_source or "").startswith(LIVE):  # from the Python API: nothing to import in the child
        raise RuntimeError("the model was given as a Python object, which the profiling process cannot build "
                           "again: no profile and no predictions (give the model as FILE.py:NAME to get them)")
    paths = traces if traces is not None else [trace_path, *[None] * (len(keys) - 1)]
    request = (run_cfg, [tuple(k) for k in keys], [str(t) if t else None for t in paths], facts)
    answer = subproc.run_module("speedladder.profile.step_profile", request, "the profiling process",
                                timeout_s * len(keys))
    assert isinstance(answer, list)
    return answer


def run_in_child(run_cfg, rungs: tuple[str, ...] = (), trace_path: Path | None = None,
                 timeout_s: float = 900.0) -> dict:
    """Profile one spec in a fresh Python process (profiles_in_child); raises with its error if it failed."""
    b = profiles_in_child(run_cfg, [rungs], timeout_s, trace_path)[0]
    if "error" in b:
        raise RuntimeError(b["error"])
    return b


def spec_of(b: dict) -> StepSpec:
    """The StepSpec a saved profile was taken of."""
    return StepSpec.from_dict(b["spec"])


def valid_trace(path: Path) -> int:
    """Events in a Chrome/Perfetto trace file; raises if it is not one."""
    data = json.loads(Path(path).read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    return len(events)


if __name__ == "__main__":
    sys.exit(subproc.serve(sys.argv[1:], profile_workload))
