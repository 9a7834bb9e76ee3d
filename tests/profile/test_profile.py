"""Profile, classify, predict — and the profiler never taxes a timed window."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import CPU, resolved
from rich.console import Console

from speedladder import subproc
from speedladder.cli import main
from speedladder.config.run import RunConfig
from speedladder.data.batches import BatchStream
from speedladder.measure import microbench, timer
from speedladder.profile import categories, predict, step_profile
from speedladder.records import (
    CategoryTime,
    Environment,
    MatmulFacts,
    ProfileSummary,
    Results,
    SavedModel,
    from_dict,
    storage,
)
from speedladder.report.profile_notes import print_profile, profile_notes
from speedladder.rungs import RUNGS
from speedladder.rungs.registry import BUILT_IN, Env
from speedladder.spec import StepSpec
from speedladder.step.train_step import TrainStep


def tiny_step(tiny, seed: int = 0):
    spec = tiny.base_spec
    step = TrainStep(spec, tiny.cfg.model, tiny.init, CPU, tiny.cfg.run.lr)
    return timer.stepper(step, BatchStream(tiny.corpus, spec.batch_size, spec.seq_len, CPU, seed))


@pytest.fixture(scope="module")
def tiny_profile(tiny, tmp_path_factory) -> dict:
    """The tiny baseline profiled in this process (the tests of the child process are below)."""
    trace = tmp_path_factory.mktemp("trace") / step_profile.TRACE
    b = step_profile.profile_step(tiny_step(tiny), CPU, steps=3, warmup=2, trace_path=trace)
    b["trace_path"] = str(trace)
    b["matmuls"] = microbench.matmul_facts(tiny.cfg.model, 4, 32, 2, CPU, ceiling_n=128, budget_s=0.5)
    return b


def test_categories_add_to_100_percent_and_match_the_step(tiny_profile):
    cats = tiny_profile["categories"]
    assert list(cats) == list(categories.CATEGORIES)
    assert sum(c["share"] for c in cats.values()) == pytest.approx(1.0, abs=1e-9)
    assert all(c["share"] >= 0 and c["ms"] >= 0 for c in cats.values())
    # The tiny GPT does matmuls, layer norms, a softmax, and an AdamW step: each is seen where it belongs.
    for name in ("matmul", "elementwise & norm", "reductions & softmax", "optimizer"):
        assert cats[name]["share"] > 0.005, name
    # On a CPU the categories are operator time plus the gaps between operators: they add to each step's wall time.
    for step in tiny_profile["per_step"]:
        assert sum(step["ms"].values()) == pytest.approx(step["wall_ms"], rel=0.02)
    # The median step is made of each category's median, so it is no longer than the longest step. It can be shorter
    # than the shortest one: on a shared machine a preemption lands in another category each step, and the medians
    # leave each out (CI at load 3.5: 4.5 ms of medians among steps of 8.6-8.7 ms).
    for name, c in cats.items():
        assert c["ms"] == pytest.approx(statistics.median(s["ms"][name] for s in tiny_profile["per_step"])), name
    walls = [step["wall_ms"] for step in tiny_profile["per_step"]]
    assert sum(c["ms"] for c in cats.values()) <= max(walls) * 1.02
    assert "CPU operator time" in tiny_profile["time_basis"]
    assert tiny_profile["regime"] in categories.REGIMES and tiny_profile["evidence"]
    assert tiny_profile["op_floor_us"] > 0 and tiny_profile["ops_per_step"] > 50
    assert "aten::" in tiny_profile["top_table"] and tiny_profile["top_ops"][0]["share"] > 0


def test_category_of_operator_names():
    assert categories.category("aten::addmm") == "matmul"
    assert categories.category("aten::bmm") == "matmul"
    assert categories.category("aten::_scaled_dot_product_flash_attention") == "attention"
    assert categories.category("aten::native_layer_norm") == "elementwise & norm"
    assert categories.category("aten::gelu") == "elementwise & norm"
    assert categories.category("aten::_softmax") == "reductions & softmax"
    assert categories.category("aten::copy_") == "copies & H2D"
    assert categories.category("Memcpy HtoD (Pageable -> Device)") == "copies & H2D"
    assert categories.category("aten::view") == categories.IDLE  # no arithmetic, no traffic: host time
    assert categories.category("autograd::engine::evaluate_function: MmBackward0") == categories.IDLE
    assert categories.category("Optimizer.step#AdamW.step") == "optimizer"
    assert categories.category("triton_red_fused_native_layer_norm_0") == "reductions & softmax"
    assert categories.category("triton_poi_fused_add_0") == "elementwise & norm"
    assert categories.category("## Call CompiledFxGraph fua7iaub7ueck ##") == "elementwise & norm"


def _classify(step, steps: int = 3) -> dict:
    return step_profile.profile_step(step, CPU, steps=steps, warmup=1)


def test_many_tiny_ops_are_overhead_bound():
    a, b = torch.ones(4), torch.ones(4)

    def step():
        x = a
        for _ in range(300):
            x = torch.add(x, b)
        return x

    p = _classify(step)
    assert p["regime"] == "overhead-bound", p["evidence"]
    assert p["buckets"]["overhead"] > 0.5


def test_one_big_matmul_is_compute_bound():
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    p = _classify(lambda: a @ b)
    assert p["regime"] == "compute-bound", p["evidence"]
    assert p["categories"]["matmul"]["share"] > 0.8
    assert p["matmul_tflops"] > 0  # the profiler counted the FLOPs: 2 * 512^3 per step


def test_a_big_elementwise_op_is_memory_bound():
    a, b = torch.randn(1 << 22), torch.randn(1 << 22)
    p = _classify(lambda: a * b + a)
    assert p["regime"] == "memory-bound", p["evidence"]
    assert p["memory_gbps"] > 0  # bytes counted from the recorded shapes


def test_trace_is_valid_json_with_events(tiny_profile):
    path = tiny_profile["trace_path"]
    assert step_profile.valid_trace(path) > 100
    names = {e.get("name") for e in json.loads(Path(path).read_text())["traceEvents"]}
    assert categories.STEP_MARK in names and "aten::addmm" in names


def test_every_rung_gets_a_prediction_with_a_reason(tiny_profile, tiny):
    # fp16 and bf16 are two precisions of one step: fp16 is predicted on a chain of its own. Built-in rungs only: a
    # rung file another test loaded in this process has no prediction model, and says so.
    names = [n for n, r in RUNGS.items() if n != "fp16" and r.source == BUILT_IN]
    preds = predict.chain(from_dict(ProfileSummary, tiny_profile), names, tiny.base_spec, tiny.env)
    preds += predict.chain(from_dict(ProfileSummary, tiny_profile), ["eager", "fp16"], tiny.base_spec, tiny.env)[1:]
    assert [p.rung for p in preds] == [*names, "fp16"]
    for p in preds:
        assert p.speedup is not None and p.speedup > 0, p.rung
        assert len(p.reason) > 20, p.rung
    by = {p.rung: p for p in preds}
    assert by["eager"].speedup == 1.0
    assert by["ckpt"].speedup < 1.0  # a memory rung is predicted to cost speed
    assert by["batch"].tokens_per_step == 2 * by["bf16"].tokens_per_step


def synthetic(matmul: float, tail: float, idle: float, optimizer: float = 0.0, bf16: float = 4.0,
              gain: float = 2.0) -> ProfileSummary:
    """A profile made by hand, for the arithmetic of the model."""
    ms = {c: 0.0 for c in categories.CATEGORIES}
    ms.update({"matmul": matmul, "elementwise & norm": tail, categories.IDLE: idle, "optimizer": optimizer})
    total = sum(ms.values())
    return ProfileSummary(categories={c: CategoryTime(ms=v, share=v / total) for c, v in ms.items()},
                          matmuls=MatmulFacts(bf16_speedup=bf16, batch_gain={"fp32": gain, "bf16": gain},
                                              multiplier=4))


def test_prediction_arithmetic_by_hand(tiny):
    p = synthetic(matmul=50, tail=30, idle=20)
    base = StepSpec(4, 32)
    env = tiny.env  # batch multiplier 2 on the tiny preset: the batch rung doubles
    x = {q.rung: q.speedup for q in predict.chain(p, ["eager", "compile"], base, env)}
    assert x["compile"] == pytest.approx(100 / (50 + 30 / 3 + 20 / 3))
    x = {q.rung: q.speedup for q in predict.chain(p, ["bf16"], base, env)}
    assert x["bf16"] == pytest.approx(100 / (50 / 4 + 30 + 20))
    # Batch x4 with matmuls twice as efficient: 4x the tokens in 50*4/2 + 30*4 + 20 = 340 ms instead of 100.
    env4 = type(env)(env.device_type, env.cuda_capability, 4)
    x = {q.rung: q.speedup for q in predict.chain(p, ["batch"], base, env4)}
    assert x["batch"] == pytest.approx(4 * 100 / (50 * 4 / 2 + 30 * 4 + 20))
    x = {q.rung: q.speedup for q in predict.chain(p, ["ckpt"], base, env)}
    assert x["ckpt"] == pytest.approx(100 / (50 * 4 / 3 + 30 * 4 / 3 + 20 * (1 + 1 / 6)))


def test_small_matmuls_predict_a_loss_for_bf16(tiny):
    # Where bf16 matmuls are slower than fp32 at the model's shapes (casts dominate), the prediction is a loss.
    p = synthetic(matmul=60, tail=30, idle=10, bf16=0.8)
    (q,) = predict.chain(p, ["bf16"], StepSpec(4, 32), tiny.env)
    assert q.speedup < 1.0


def _window_rates(step, n_windows: int = 5, steps: int = 15, warmup: int = 30) -> list[float]:
    """Tokens per second of this thread's CPU time, window by window. A profiler's cost is work done in this
    thread; a neighbour's load (another test process on the same 2 cores) takes wall time, not this thread's CPU
    time, so the comparison below holds on a loaded machine."""
    # Warm-up as the ladder's rungs get it: the first steps after another process was torn down are not the steady state.
    for _ in range(warmup):
        step()
    rates = []
    for _ in range(n_windows):
        start = time.thread_time()
        for _ in range(steps):
            step()
        rates.append(steps * 128 / (time.thread_time() - start))
    return rates


@pytest.mark.slow
def test_the_profile_runs_in_a_child_and_leaves_this_process_unprofiled(tiny, tmp_path, one_thread):
    """The profile runs in a child process, so no profiler is left running here to tax the windows timed after it.
    What that is worth in speed is measured on the real clock by bench/meters.py, not asserted here."""
    step = tiny_step(tiny)
    b = step_profile.run_in_child(RunConfig(preset="tiny", device="cpu", rungs=("eager",)), (),
                           tmp_path / step_profile.TRACE, timeout_s=300)
    assert b["regime"] in categories.REGIMES and step_profile.valid_trace(tmp_path / step_profile.TRACE) > 0
    assert not torch.autograd.profiler._is_profiler_enabled
    assert all(r > 0 for r in _window_rates(step, n_windows=3, warmup=2))  # timing goes on as before


@pytest.mark.slow
def test_profile_command_writes_profile_and_trace(tmp_path, capsys):
    rc = main(["profile", "--preset", "tiny", "--device", "cpu", "--profile-steps", "2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    saved = json.loads((folder / step_profile.FILENAME).read_text())
    assert saved["schema"] == storage.SCHEMA and saved["kind"] == "profile"
    b = saved["profile"]
    assert b["steps"] == 2 and b["regime"] in categories.REGIMES
    assert sum(c["share"] for c in b["categories"].values()) == pytest.approx(1.0)
    assert [p["rung"] for p in saved["predictions"]] == ["eager", "compile", "bf16", "batch", "ckpt"]
    assert step_profile.valid_trace(folder / step_profile.TRACE) > 0
    # The regime as printed: its name, or "borderline (a / b)" when two steps' spread cannot tell them apart.
    for text in ("top operators", "regime: " + b["regime_label"], "predictions", "roofline"):
        assert text in out
    # torch's own table of the top operators, as saved (which operators lead it depends on the machine's minute).
    assert all(line.strip() in out for line in b["top_table"].splitlines() if "aten::" in line)
    assert "aten::" in b["top_table"]
    # `report` reads the saved profile back and prints the same.
    assert main(["report", str(folder)]) == 0
    again = capsys.readouterr().out
    assert "regime: " + b["regime_label"] in again and "predictions" in again


@pytest.mark.parametrize("args, message", [
    (["--profile-rungs", "warp"], "unknown rung 'warp'"),
    (["--profile-steps", "0"], "at least one profiled step"),
])
def test_profile_bad_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    rc = main(["profile", "--preset", "tiny", "--device", "cpu", "--out", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err


class FakeEvent:
    """What breakdown() reads of a torch.profiler FunctionEvent, to check the CUDA arithmetic without a GPU."""

    def __init__(self, name: str, cpu_us: float, device_us: float, parent: FakeEvent | None = None) -> None:
        self.name, self.self_cpu_time_total, self.self_device_time_total = name, cpu_us, device_us
        self.cpu_parent, self.cpu_children = parent, []
        self.input_shapes, self.input_dtypes, self.flops = [[256, 256], [256, 256]], ["float", "float"], 0
        if parent is not None:
            parent.cpu_children.append(self)


def test_cuda_breakdown_counts_kernel_time_and_the_gpu_waiting():
    opt = FakeEvent("Optimizer.step#AdamW.step", 300, 0)
    events = [FakeEvent("aten::mm", 20, 600), FakeEvent("aten::add", 10, 200), opt,
              FakeEvent("aten::mul_", 5, 100, parent=opt), FakeEvent("aten::view", 3, 0)]
    b = categories.breakdown([events], walls_us=[1000], device_time=True, op_floor_us=0.0)
    shares = {c: v["share"] for c, v in b["categories"].items()}
    # Kernel time only (host time of the ops is not device time); the rest of the step is the GPU waiting.
    assert shares["matmul"] == pytest.approx(0.6) and shares["elementwise & norm"] == pytest.approx(0.2)
    assert shares["optimizer"] == pytest.approx(0.1) and shares[categories.IDLE] == pytest.approx(0.1)
    assert sum(shares.values()) == pytest.approx(1.0) and b["floor_share"] == 0.0
    assert categories.regime(b)[0] == "compute-bound"
    # The same events on a CPU: operator (host) time is the device time, and what no operator covers is idle.
    c = categories.breakdown([events], walls_us=[400], device_time=False, op_floor_us=1.0)
    cpu = {k: v["ms"] * 1e3 for k, v in c["categories"].items()}
    assert cpu["matmul"] == pytest.approx(20) and cpu["optimizer"] == pytest.approx(305)
    assert cpu[categories.IDLE] == pytest.approx(3 + (400 - 338))  # the view op plus the gaps


@pytest.mark.slow
def test_several_specs_profile_in_one_child_and_a_failing_one_says_why():
    """Explaining misses profiles several specs in one process: each answers for itself, a bad one with its
    error; and without facts, none of the microbenchmarks the predictions need."""
    run = RunConfig(preset="tiny", device="cpu", rungs=("eager",), profile=dataclasses.replace(
        RunConfig().profile, steps=2))
    ok, bad, again = step_profile.profiles_in_child(run, [("ckpt",), ("no-such-rung",), ()], timeout_s=300, facts=False)
    assert ok["rungs"] == ["ckpt"] and ok["spec"]["transforms"] == ["activation-checkpointing"] and ok["steps"] == 2
    assert ok["matmuls"] == {} and ok["copy_gbps"] is None  # facts=False: no microbenchmarks
    assert "no-such-rung" in bad["error"] and set(bad) == {"error"}
    assert again["rungs"] == [] and again["spec"]["transforms"] == [] and again["regime"] in categories.REGIMES


def test_a_child_process_ignores_modules_in_the_working_directory(tmp_path, monkeypatch):
    """`python -m` puts the working directory first on sys.path: a user's own speedladder.py there must not
    replace the package in the profiler's, the memory probe's or the ranks' process."""
    (tmp_path / "speedladder.py").write_text("raise SystemExit('the shadow ran')\n")
    monkeypatch.chdir(tmp_path)
    cmd = [sys.executable, "-m", "speedladder", "--version"]
    unguarded = {**subproc.child_env(), "PYTHONSAFEPATH": ""}
    shadowed = subprocess.run(cmd, check=False, capture_output=True, text=True, env=unguarded)
    assert "the shadow ran" in shadowed.stderr  # the check can fail: without the guard, the shadow wins
    if sys.version_info >= (3, 11):  # PYTHONSAFEPATH is Python 3.11's
        safe = subprocess.run(cmd, check=False, capture_output=True, text=True, env=subproc.child_env())
        assert safe.returncode == 0 and safe.stdout.startswith("speedladder "), safe.stderr


def test_the_matmul_ceiling_runs_at_every_precision_and_leaves_the_process_as_it_found_it():
    """The ceiling an unlisted device is taken against: a real n x n x n product at each precision a rung runs
    in (fp8 through torch._scaled_mm, which runs on a CPU too); TF32 is process-wide state, put back after."""
    before = torch.get_float32_matmul_precision()
    for precision in ("fp32", "tf32", "bf16", "fp16", "fp8"):
        try:
            tflops = microbench.matmul_ceiling(CPU, precision, 64, 0.01)
        except RuntimeError as e:  # oneDNN capped by ONEDNN_MAX_CPU_ISA (.ci/run's forced ISA) has no fp8 product
            assert precision == "fp8" and os.environ.get("ONEDNN_MAX_CPU_ISA") and "primitive" in str(e), e
            continue
        assert 0 < tflops < float("inf"), precision
        assert torch.get_float32_matmul_precision() == before
    assert microbench.ceiling_side(CPU) == 512 and microbench.ceiling_side(torch.device("cuda")) == 4096


# -- host and device (CUDA), on synthetic events and the H200's figures ----------------------------------------------

CUDA = torch.autograd.DeviceType.CUDA
HOST = torch.autograd.DeviceType.CPU


class Range:
    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end


class TimedEvent(FakeEvent):
    """A FakeEvent with what the step spans and the device's busy time read: its interval and where it ran."""

    def __init__(self, name: str, start: float, end: float, device=HOST, device_us: float = 0.0,
                 annotation: bool = False) -> None:
        super().__init__(name, end - start if device == HOST else 0.0, device_us)
        self.time_range, self.device_type, self.is_user_annotation = Range(start, end), device, annotation


def cuda_step(t0: float) -> list[TimedEvent]:
    """One profiled CUDA step as torch.profiler reports it: the step's range on the host and its copy on the device
    (a GPU user annotation over part of the kernels), the operators on the host with the kernel time they launched,
    the kernels themselves, and the optimizer's range copied to the device too."""
    return [TimedEvent(categories.STEP_MARK, t0, t0 + 30_000),
            TimedEvent(categories.STEP_MARK, t0 + 500, t0 + 10_500, CUDA, annotation=True),
            TimedEvent("aten::mm", t0 + 100, t0 + 200, device_us=6_000),
            TimedEvent("aten::add", t0 + 20_000, t0 + 20_050, device_us=2_000),  # after the device copy ends
            TimedEvent("Optimizer.step#AdamW.step", t0 + 24_000, t0 + 24_900),
            TimedEvent("sm80_xmma_gemm", t0 + 600, t0 + 6_600, CUDA),
            TimedEvent("elementwise_kernel", t0 + 20_100, t0 + 22_100, CUDA),
            TimedEvent("Optimizer.step#AdamW.step", t0 + 25_000, t0 + 26_000, CUDA, annotation=True),
            TimedEvent("multi_tensor_apply_kernel", t0 + 25_000, t0 + 25_800, CUDA)]


def test_a_host_range_and_its_device_copy_make_one_step_not_two():
    events = cuda_step(0) + cuda_step(40_000)
    spans = step_profile.host_spans(events)
    assert spans == [(0, 30_000), (40_000, 70_000)]  # both copies of each range counted: four half-steps
    per_step = step_profile.step_events(events, spans)
    assert [sorted(e.name for e in step) for step in per_step] == [
        ["Optimizer.step#AdamW.step", "aten::add", "aten::mm"]] * 2  # every operator in its step, none dropped
    busy = step_profile.device_busy_us(events, spans)
    assert busy == [6_000 + 2_000 + 800] * 2  # the kernels, not the ranges that mark them
    b = categories.breakdown(per_step, [t - s for s, t in spans], device_time=True, op_floor_us=0.0, busy_us=busy,
                             step_us=9_000)
    assert len(b["per_step"]) == 2 and b["device_ms"] == pytest.approx(8.8)
    assert b["categories"]["matmul"]["ms"] == pytest.approx(6.0)
    assert b["categories"]["elementwise & norm"]["ms"] == pytest.approx(2.0)
    # Idle is the device's wait in the unprofiled step (9 ms), not in the 30 ms the profiler slowed the host to.
    assert b["categories"][categories.IDLE]["ms"] == pytest.approx(1.0)


def test_device_busy_time_is_the_union_of_kernel_intervals():
    assert step_profile.busy_us([(0, 10), (5, 15), (20, 30), (25, 28)], 0, 40) == 25  # overlaps counted once
    assert step_profile.busy_us([(-5, 5), (35, 50)], 0, 40) == 10  # clipped to the step
    assert step_profile.busy_us([(0, 40), (10, 20)], 0, 40) == 40  # never more than the span
    two_streams = [TimedEvent(categories.STEP_MARK, 0, 100), TimedEvent("k1", 10, 60, CUDA),
                   TimedEvent("k2", 40, 90, CUDA), TimedEvent("nccl", 95, 120, CUDA)]
    assert step_profile.device_busy_us(two_streams, step_profile.host_spans(two_streams)) == [85]


def test_the_host_time_leaves_out_the_wait_for_the_device():
    """A fake device: each step's call returns after 2 ms of host work and queues 8 ms of device work; the sync waits
    for the queue. The host's part is the 2 ms, and steps back to back take the device's 8 ms."""
    queue = {"until": 0.0}

    def step():
        time.sleep(0.002)
        queue["until"] = max(queue["until"], time.perf_counter()) + 0.008

    def sync_device():
        time.sleep(max(queue["until"] - time.perf_counter(), 0.0))

    t = step_profile.unprofiled(step, sync_device, steps=5)
    assert 2.0 <= t["host_ms"] < 6.0  # a sleep is never shorter than asked; a busy machine can make it longer
    assert 8.0 <= t["step_ms"] < 14.0


H200 = Path(__file__).parents[1] / "fixtures" / "h200-d2l512-profile.json"
H200_ENV = Env("cuda", (9, 0), 8)  # an H200, the batch rung's multiple 8 (d2l-512's B=64 to 512)


def h200(key: str) -> tuple[ProfileSummary, StepSpec, dict]:
    """A profile of the H200 run of 2026-12-04 (tests/fixtures, each figure's derivation beside it), classified."""
    data = json.loads(H200.read_text())
    d = data[key]["profile"]
    d.update(categories.classify(d))
    return from_dict(ProfileSummary, d), StepSpec.from_dict(d["spec"]), data["measured"]


def test_predictions_from_the_h200_profile_land_near_what_the_h200_measured():
    """compile and bf16 within ±25% of the H200's measurement; CUDA graphs above 2x where an eager bf16 step's device
    idles for a third of it. The old profile (every step doubled, an additive model) predicted 2.18x and 1.41x."""
    env = H200_ENV
    fp32, base, measured = h200("eager_fp32")
    assert fp32.apart and fp32.bound == "device" and fp32.regime == "compute-bound"
    compile_, bf16 = predict.chain(fp32, ["compile", "bf16"], base, env)
    assert compile_.speedup == pytest.approx(measured["compile_x"], rel=0.25)
    assert bf16.speedup == pytest.approx(measured["bf16_x"], rel=0.25)
    assert compile_.bound == "device" and bf16.bound == "host"  # bf16's matmuls fall below the host's time
    assert "host-bound" in bf16.reason
    eager_bf16, base16, _ = h200("eager_bf16")
    assert eager_bf16.bound == "host" and eager_bf16.regime == "overhead-bound"
    assert eager_bf16.categories[categories.IDLE].share > 1 / 3
    (graphs,) = predict.chain(eager_bf16, ["cudagraphs"], base16, env)
    assert graphs.speedup > 2.0 and graphs.bound == "device"
    # Blind to the host (the device's figures alone, added up as on a CPU), bf16 misses: its step is host-bound.
    blind = dataclasses.replace(fp32, host_ms=None, device_ms=None)
    assert predict.chain(blind, ["compile", "bf16"], base, env)[1].speedup > 1.25 * measured["bf16_x"]


def apart(matmul: float, tail: float, host: float, serial: float = 0.0) -> ProfileSummary:
    """A CUDA profile made by hand: device time by category, the host's time a step apart from it."""
    p = synthetic(matmul=matmul, tail=tail, idle=0.0)
    return dataclasses.replace(p, host_ms=host, device_ms=matmul + tail, serial_ms=serial, device_type="cuda")


def test_a_gpu_step_costs_the_larger_of_host_and_device_a_cpu_step_their_sum(tiny):
    base, env = StepSpec(4, 32), Env("cuda", (9, 0), 4)
    p = apart(matmul=8.0, tail=2.0, host=6.0, serial=1.0)  # device-bound: 10 ms of kernels, 6 ms of host, 1 serial
    (x,) = predict.chain(p, ["bf16"], base, env)
    # Matmuls 4x faster: the device's 8 + 2 ms become 2 + 2, under the host's 6: the step is the host's 6 + 1.
    assert x.speedup == pytest.approx((10 + 1) / (6 + 1)) and x.bound == "host"
    assert x.host_ms == pytest.approx(6.0) and x.device_ms == pytest.approx(4.0)
    # Batch x4, matmuls twice as efficient: the device's 8*4/2 + 2*4 = 24 ms, the host's 6 paid once a step.
    (y,) = predict.chain(p, ["batch"], base, env)
    assert y.speedup == pytest.approx(4 * 11 / (24 + 1)) and y.bound == "device"
    # CUDA graphs from eager: 90% of the host's time goes and the tail is fused (no bandwidths: 1/3 of it kept).
    (z,) = predict.chain(apart(matmul=2.0, tail=3.0, host=12.0), ["cudagraphs"], base, env)
    assert z.speedup == pytest.approx(12 / (2 + 1)) and z.bound == "device"
    # On a CPU the host is the device: the same parts add up, as they always did.
    cpu = synthetic(matmul=8.0, tail=2.0, idle=6.0)
    (w,) = predict.chain(cpu, ["bf16"], base, tiny.env)
    assert w.speedup == pytest.approx(16 / (2 + 2 + 6)) and w.bound is None and w.host_ms is None


def test_the_report_says_which_of_host_and_device_bounds_the_step(capsys):
    fp32, base, _ = h200("eager_fp32")
    preds = predict.chain(fp32, ["eager", "compile", "bf16"], base, H200_ENV)
    saved = Results(schema="2", status="complete", created="", command=[], config=resolved(),
                    environment=Environment(), model=SavedModel(), profile=fp32,
                    predictions=[p.record() for p in preds])
    notes = " ".join(profile_notes(saved))
    assert "host and device: the host takes 15.3 ms a step" in notes and "device-bound" in notes
    assert "regime: compute-bound — host 15.3 ms a step against device 26.4 ms" in notes
    print_profile(saved, Console(width=200, force_terminal=False))
    out = capsys.readouterr().out
    assert "bound" in out and "host-bound" in out and "(26.43 ms without it)" in out
    # A profile saved before host and device were apart prints as it did: no such line, no such column.
    old = dataclasses.replace(fp32, host_ms=None, device_ms=None, timed_step_ms=None, serial_ms=None)
    assert not any(n.startswith("host and device") for n in profile_notes(dataclasses.replace(saved, profile=old)))
