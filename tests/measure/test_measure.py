"""Part 6: the meters, tested against known quantities (docs/measurement.md, rules 1-4)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import CPU, run_windows
from torch.utils.flop_counter import FlopCounterMode

from speedladder.measure import counters, devicemem, judging, peakflops, timer
from speedladder.measure.judging import Spread
from speedladder.measure.timer import Timing, Window
from speedladder.models import definition
from speedladder.spec import StepSpec


class FakeCompiler:
    """A compile counter that a fake step bumps on the calls we choose."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        return self.n


def test_a_step_of_known_length_times_right(clock):
    """A step that takes 20 ms (on a clock the test moves, so nothing here depends on the machine) is 20 ms:
    tokens/s = tokens / 0.02. The same check on the real clock, with a sleep, is bench/meters.py's."""
    timing = run_windows(lambda: clock.advance(0.02), CPU, tokens_per_step=1000, steps=5, windows=3,
                         warmup=1, max_warmup=5, counter=FakeCompiler())
    rate = judging.tokens_per_s(timing)
    assert len(timing.windows) == 3
    assert all(w.steps == 5 and w.tokens == 5000 for w in timing.windows)
    assert rate.median == pytest.approx(50_000) and judging.step_ms(timing) == pytest.approx(20)


def test_compilation_stays_out_of_the_windows_and_is_reported_apart(clock):
    compiler = FakeCompiler()
    calls = []

    def step():
        calls.append(1)
        if len(calls) <= 2:  # "compiles" on its first two calls: forward, then a late recompile
            compiler.n += 1
            clock.advance(0.3)
        clock.advance(0.005)

    timing = run_windows(step, CPU, 100, steps=4, windows=3, warmup=2, max_warmup=10, counter=compiler)
    assert timing.first_step_s == pytest.approx(0.305)
    assert timing.warmup_compiled == [True, False, False]  # warm-up ran until 2 quiet steps in a row
    assert all(w.recompiles == 0 for w in timing.windows)
    assert all(w.seconds == pytest.approx(0.02) for w in timing.windows)  # no compile time inside
    compile_s = timer.compile_seconds(timing, judging.step_ms(timing) / 1e3)
    assert compile_s == pytest.approx(0.6)


def test_warmup_gives_up_when_compilation_never_settles():
    compiler = FakeCompiler()

    def step():
        compiler.n += 1

    timing = run_windows(step, CPU, 1, steps=2, windows=3, warmup=2, max_warmup=4, counter=compiler)
    assert not timing.settled
    assert len(timing.warmup_step_s) == 4


def test_a_window_that_recompiles_is_flagged_and_left_out(clock):
    compiler = FakeCompiler()
    calls = []

    def step():
        calls.append(1)
        clock.advance(0.001)
        if len(calls) == 9:  # inside the second window (first step 1, warm-up 2-3, windows of 3 steps)
            compiler.n += 1
            clock.advance(0.05)

    timing = run_windows(step, CPU, 10, steps=3, windows=3, warmup=2, max_warmup=5, counter=compiler)
    assert [w.recompiles for w in timing.windows] == [0, 1, 0]
    assert len(timing.clean_windows) == 2
    assert judging.tokens_per_s(timing).min == pytest.approx(10 / 0.001)  # the slow window is not in the statistics


def test_real_recompiles_are_counted():
    f = torch.compile(lambda x: torch.sin(x) * 2, dynamic=False, backend="eager")
    sizes = iter(range(1, 100))
    timing = run_windows(lambda: f(torch.ones(4)), CPU, 1, steps=2, windows=3, warmup=1, max_warmup=5)
    assert [w.recompiles for w in timing.windows] == [0, 0, 0]
    assert timing.first_step_s > 0
    timing = run_windows(lambda: f(torch.ones(next(sizes) + 4)), CPU, 1, steps=2, windows=3, warmup=0,
                         max_warmup=5)
    assert all(w.recompiles >= 1 for w in timing.windows)  # a new shape each call: never a clean window
    assert judging.tokens_per_s(timing) is None


def test_device_is_synchronized_at_window_edges_only(monkeypatch):
    log = []
    monkeypatch.setattr(devicemem, "sync", lambda device: log.append("sync"))
    run_windows(lambda: log.append("step"), CPU, 1, steps=4, windows=3, warmup=1, max_warmup=5,
                counter=FakeCompiler())
    timed = "".join("s" if e == "step" else "|" for e in log)
    # first step and the warm-up step are each synchronized; then every window is |ssss|.
    assert timed == "|s|" + "s|" + "|ssss|" * 3


def test_spread_and_verdicts():
    timing = Timing(0.0, [], [], [Window(1.0, 10, 1000, 0), Window(0.5, 10, 1000, 0), Window(2.0, 10, 1000, 0)])
    s = judging.tokens_per_s(timing)
    assert (s.median, s.min, s.max) == (1000, 500, 2000)
    base = Spread(100, 95, 105)
    assert judging.verdict(Spread(130, 120, 140), base) == "win"
    assert judging.verdict(Spread(80, 75, 85), base) == "loss"
    assert judging.verdict(Spread(103, 99, 110), base) == "noise"  # inside the spread is not a win


def test_flops_per_token_palm_convention():
    # GPT-2 124M at T=1024, by hand: 6 * 123,653,376 + 12 * 12 * 12 * 64 * 1024.
    assert definition.flops_per_token(123_653_376, 12, 12, 64, 1024) == 741_920_256 + 113_246_208


def test_flops_per_token_against_counted_flops(tiny):
    """6N + 12LHQT against the FLOPs torch counts in one forward and backward of the real model."""
    from speedladder.models.gpt import GPT

    cfg = tiny.cfg.model
    torch.manual_seed(0)
    model = GPT(cfg)
    idx = torch.randint(cfg.vocab_size, (4, cfg.block_size))
    counter = FlopCounterMode(display=False)
    with counter:
        _, loss = model(idx, idx)
        loss.backward()
    tokens = idx.numel()
    predicted = definition.flops_per_token(model.matmul_params(), cfg.n_layer, cfg.n_head, cfg.head_dim,
                                        cfg.block_size) * tokens
    # The formula also counts biases and LayerNorm weights as if they were matmul weights: a small excess.
    assert counter.get_total_flops() == pytest.approx(predicted, rel=0.05)


# Every device name the peak table lists, as torch.cuda.get_device_name() spells it, and the model it is.
LISTED = [
    ("Tesla T4", "T4"),
    ("Tesla V100-SXM2-16GB", "V100 SXM2"), ("Tesla V100-SXM2-32GB", "V100 SXM2"),
    ("Tesla V100-PCIE-16GB", "V100 PCIe"), ("Tesla V100-PCIE-32GB", "V100 PCIe"),
    ("Tesla V100S-PCIE-32GB", "V100S PCIe"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA A100-SXM4-40GB", "A100"), ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A100-PCIE-40GB", "A100"), ("NVIDIA A100 80GB PCIe", "A100"),
    ("NVIDIA L4", "L4"), ("NVIDIA L40", "L40"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 SXM5 80GB", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GeForce RTX 3090", "RTX 3090"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA GeForce RTX 5090", "RTX 5090"),
    ("AMD Instinct MI300X", "MI300X"), ("AMD Instinct MI300X VF", "MI300X"),
]
# Names a look-alike match would take for a listed device: each is another device, or one without a datasheet.
NOT_LISTED = [
    "NVIDIA A10G",  # AWS's board of the A10's chip, other clocks, no datasheet: not the A10, not the A100
    "NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 4080", "NVIDIA GeForce RTX 4080 SUPER",
    "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 5090 D", "NVIDIA GeForce RTX 5080",
    "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA RTX 6000 Ada Generation",
    "NVIDIA H100", "NVIDIA H800", "NVIDIA GH200 480GB", "NVIDIA B100", "NVIDIA GB200",
    "Tesla V100-SXM3-32GB", "Tesla P100-PCIE-16GB", "AMD Instinct MI300A", "AMD Instinct MI325X",
    "AMD EPYC 7B13", "Intel(R) Xeon(R) CPU @ 2.20GHz", "Apple GPU (MPS)",
]


@pytest.mark.parametrize("name, model", LISTED)
def test_every_listed_device_name_finds_its_own_datasheet(name, model):
    sheet = peakflops.datasheet(name)
    assert sheet is not None and sheet.model == model and name in sheet.names
    assert peakflops.device_model(name, sheet.capability) == model  # its own capability: the same match


def test_the_table_lists_each_name_once_and_a_test_feeds_every_one():
    listed = [n for sheet in peakflops.DATASHEETS for n in sheet.names]
    assert sorted(listed) == sorted(name for name, _ in LISTED)
    claimed: dict[frozenset[str], set[str]] = {}
    for sheet in peakflops.DATASHEETS:
        for n in sheet.names:
            claimed.setdefault(peakflops.name_words(n), set()).add(sheet.model)
    # No two entries claim one device (the 16 and 32 GB names of one board are one): the table's order is moot.
    assert all(len(models) == 1 for models in claimed.values())
    assert len({sheet.model for sheet in peakflops.DATASHEETS}) == len(peakflops.DATASHEETS)


@pytest.mark.parametrize("name", NOT_LISTED)
def test_a_name_not_in_the_table_matches_nothing(name):
    assert peakflops.datasheet(name) is None and peakflops.peak_tflops(name, "bf16") is None


def test_look_alike_names_are_told_apart():
    assert peakflops.device_model("NVIDIA L40") == "L40" and peakflops.device_model("NVIDIA L4") == "L4"
    assert peakflops.peak_tflops("NVIDIA L40", "fp32") == 90.5  # not the L4's 30.3: MFU would be 3x too high
    assert peakflops.device_model("NVIDIA H100 PCIe") == "H100 PCIe"
    assert peakflops.device_model("NVIDIA H100 80GB HBM3") == "H100 SXM"
    assert peakflops.peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0 != peakflops.peak_tflops("NVIDIA H100 80GB HBM3",
                                                                                         "bf16")
    assert peakflops.device_model("NVIDIA A10") == "A10" and peakflops.device_model("NVIDIA A10G") is None
    assert peakflops.device_model("NVIDIA A100-SXM4-40GB") == "A100"
    assert peakflops.device_model("NVIDIA GeForce RTX 4090 D") is None  # fewer cores than the 4090
    assert peakflops.device_model("NVIDIA GeForce RTX 4080") is None
    assert peakflops.device_model("nvidia geforce rtx 4090") == "RTX 4090"  # case is no part of a name
    assert peakflops.name_words("NVIDIA A100-SXM4-80GB") == peakflops.name_words("NVIDIA A100_SXM4 40GB")


def test_a_capability_that_is_not_the_devices_takes_no_datasheet():
    assert peakflops.device_model("NVIDIA H100 80GB HBM3", (9, 0)) == "H100 SXM"
    assert peakflops.device_model("NVIDIA H100 80GB HBM3", (8, 0)) is None
    assert peakflops.device_model("AMD Instinct MI300X", (9, 4)) == "MI300X"  # ROCm's gfx942
    assert peakflops.device_model("NVIDIA GeForce RTX 5090", (10, 0)) is None  # B200's, not the 5090's 12.0


def test_a_precision_a_device_lacks_is_absent_not_guessed():
    for name in ("Tesla T4", "Tesla V100-SXM2-16GB"):  # fp16 tensor cores; no bf16, no tf32, no fp8
        assert peakflops.peak_tflops(name, "fp16") is not None and peakflops.peak_tflops(name, "fp32") is not None
        assert [peakflops.peak_tflops(name, p) for p in ("bf16", "tf32", "fp8")] == [None, None, None]
    for name in ("NVIDIA A100-SXM4-80GB", "NVIDIA A10", "NVIDIA GeForce RTX 3090"):  # Ampere: no fp8
        assert peakflops.peak_tflops(name, "fp8") is None and peakflops.peak_tflops(name, "bf16") is not None
    for sheet in peakflops.DATASHEETS:
        assert set(sheet.tflops) <= {"fp32", "tf32", "bf16", "fp16", "fp8"} and "fp32" in sheet.tflops
        assert sheet.source.startswith(("NVIDIA ", "AMD ")) and "https://" in sheet.source
        # Tensor cores at least match the plain fp32 rate; a lower precision is never slower than a higher one.
        rates = [sheet.tflops[p] for p in ("fp32", "tf32", "bf16", "fp8") if p in sheet.tflops]
        assert rates == sorted(rates)


def test_peak_table_and_mfu():
    assert peakflops.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert peakflops.peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert peakflops.peak_tflops("NVIDIA H100 NVL", "bf16") == 835.5  # not the SXM's figure
    assert peakflops.peak_tflops("NVIDIA H200", "tf32") == 494.7
    assert peakflops.peak_tflops("NVIDIA A100-SXM4-80GB", "fp32") == 19.5
    assert peakflops.peak_tflops("NVIDIA H200", "fp8") == 1978.9
    assert peakflops.peak_tflops("NVIDIA L40", "bf16") == 181.05 and peakflops.peak_tflops("NVIDIA L4", "bf16") == 121.0
    assert peakflops.peak_tflops("Tesla T4", "fp16") == 65.0
    assert peakflops.peak_tflops("Tesla V100-PCIE-32GB", "fp16") == 112.0
    assert peakflops.peak_tflops("NVIDIA GeForce RTX 4090", "bf16") == 165.2  # fp32 accumulate: half the fp16-acc rate
    assert peakflops.peak_tflops("NVIDIA B200", "bf16") == 2250.0
    assert peakflops.peak_tflops("AMD Instinct MI300X", "bf16") == 1307.4  # its own, not a peak borrowed from another chip
    assert peakflops.peak_tflops("NVIDIA A100-SXM4-80GB", "fp8") is None  # no float8 tensor cores
    assert peakflops.peak_tflops("AMD EPYC", "bf16") is None  # not in the table: measured, not guessed
    assert peakflops.mfu(100_000, 1_000_000_000, None) is None
    assert peakflops.mfu(500_000, 855_166_464, 989.4) == pytest.approx(500_000 * 855_166_464 / 989.4e12)


def test_a_given_peak_is_per_precision_and_the_others_come_from_the_datasheet_or_a_measurement():
    given = {"bf16": 500.0, "fp32": 50.0}
    h100 = ("NVIDIA H100 80GB HBM3", "cuda", (9, 0))
    assert peakflops.known_peak(given, *h100, "bf16") == peakflops.Peak(500.0, peakflops.GIVEN)
    assert peakflops.known_peak(given, *h100, "tf32") == peakflops.Peak(494.7, "datasheet peak of the H100 SXM")
    assert peakflops.known_peak(None, *h100, "tf32") == peakflops.Peak(494.7, "datasheet peak of the H100 SXM")
    # Known nowhere: None, and the ladder measures the device's ceiling (a CPU, an unknown GPU, a lacking precision).
    assert peakflops.known_peak(None, "Intel Xeon", "cpu", None, "fp32") is None
    assert peakflops.known_peak(None, "NVIDIA H100 80GB HBM3", "cpu", None, "fp32") is None  # a CPU's name is no GPU's
    assert peakflops.known_peak(None, "NVIDIA GeForce RTX 4080", "cuda", (8, 9), "bf16") is None
    assert peakflops.known_peak(None, "Tesla T4", "cuda", (7, 5), "bf16") is None
    assert peakflops.known_peak(given, "Intel Xeon", "cpu", None, "fp32") == peakflops.Peak(50.0, peakflops.GIVEN)


def test_a_measured_peak_says_so():
    p = peakflops.measured_peak(0.25, 512)
    assert p.tflops == 0.25 and peakflops.is_measured(p.basis) and "512×512×512" in p.basis
    assert not peakflops.is_measured(peakflops.GIVEN) and not peakflops.is_measured("datasheet peak of the L4")


def test_an_unknown_device_gets_its_matmul_ceiling_measured_once_per_precision_and_its_mfu_marked(
        tmp_path, monkeypatch):
    """A GPU missing from the table (mocked: a CUDA device named "NVIDIA GeForce RTX 4080" on this machine, whose
    matmuls run on the CPU) is taken against its own ceiling measured on the spot, at each precision, once; a
    listed GPU is taken against its datasheet with nothing measured. The MFU shows the basis in the cell and note."""
    from speedladder.config.run import RunConfig
    from speedladder.ladder import climb as ladder_module
    from speedladder.ladder import rung_memory
    from speedladder.measure import microbench
    from speedladder.records import Role, RungResult
    from speedladder.report.mfu import MEASURED_MARK, mfu_cell, mfu_notes
    from speedladder.spec import StepSpec
    from speedladder.step.workload import prepare

    work = prepare(RunConfig(preset="tiny", device="cpu"))
    ladder = ladder_module.Ladder(work, tmp_path)
    ladder.work = dataclasses.replace(work, device=torch.device("cuda"), env=dataclasses.replace(
        work.env, device_type="cuda", cuda_capability=(8, 9)))
    ladder.flop_peaks = rung_memory.FlopPeaks(ladder.work)
    measured: list[tuple[str, int]] = []

    def ceiling(device, precision, side, budget_s):  # the real product, on the CPU standing in for the GPU
        measured.append((precision, side))
        return microbench.matmul_ceiling(CPU, precision, 256, 0.05)

    monkeypatch.setattr(rung_memory, "matmul_ceiling", ceiling)
    monkeypatch.setattr(rung_memory.storage, "device_name", lambda device: "NVIDIA GeForce RTX 4080")
    model, fpt = torch.nn.Linear(4, 4), 1_000_000
    fp32, bf16 = StepSpec(2, 8), StepSpec(2, 8, autocast="bf16")
    peaks = {spec.precision: ladder.flop_peaks.of(spec, model, fpt) for spec in (fp32, bf16, fp32)}
    assert measured == [("fp32", 4096), ("bf16", 4096)]  # once per precision, at a GPU's size
    for precision, (peak, basis) in peaks.items():
        assert peak is not None and 0 < peak < float("inf") and peak == ladder.flop_peaks.ceilings[precision]
        assert basis.startswith("measured peak, a 4096×4096×4096 matmul's throughput on this device")
    r = RungResult(name="eager", rung="eager", role=Role.RUNG, reason="", kind="speed", built_on=None, spec=fp32,
                   precision="fp32", requirement={}, peak_tflops=peaks["fp32"][0], peak_basis=peaks["fp32"][1],
                   tflops=0.01, mfu=peakflops.mfu(10_000, fpt, peaks["fp32"][0]))
    assert r.mfu == pytest.approx(0.01 / peaks["fp32"][0])  # 10,000 tokens/s x 1 MFLOP each: 0.01 TFLOP/s
    assert mfu_cell(r) == f"{100 * r.mfu:.1f}%{MEASURED_MARK}"
    (note,) = mfu_notes([r])
    assert note.startswith(f"MFU marked{MEASURED_MARK}: against the measured peak") and "fp32 " in note
    # A listed GPU: its datasheet, nothing measured.
    monkeypatch.setattr(rung_memory.storage, "device_name", lambda device: "NVIDIA GeForce RTX 4090")
    assert ladder.flop_peaks.of(bf16, model, fpt) == (165.2, "datasheet peak of the RTX 4090")
    assert len(measured) == 2
    r.peak_tflops, r.peak_basis, r.mfu = 165.2, "datasheet peak of the RTX 4090", 0.4
    assert mfu_cell(r) == "40.0%"
    assert mfu_notes([r]) == ["MFU against the datasheet peak of the RTX 4090: fp32 165 TFLOP/s."]


def test_peak_memory_is_none_without_cuda():
    assert devicemem.peak_memory(CPU) is None
    assert devicemem.peak_reserved(CPU) is None


# -- CUDA-sized windows, CUDA-graph recording, the fp8 peak ----------------------------------------


def test_window_steps_come_from_a_step_time_on_cuda_and_keep_the_configured_ones_otherwise():
    # 2 ms steps: 20 steps last 40 ms, so 250 are needed for 0.5 s; 50 ms steps: the configured 20 last 1 s.
    assert timer.window_steps(20, 0.002, 0.5) == 250
    assert timer.window_steps(20, 0.05, 0.5) == 20
    assert timer.window_steps(20, 0.0003, 0.5) == 1667  # ceil(0.5 / 0.0003): never shorter than asked
    assert timer.window_steps(20, None, 0.5) == 20  # no step time: nothing to size from
    assert timer.window_steps(20, 0.002, 0.0) == 20  # no minimum asked
    # Sized from the fastest side's steady warm-up steps (a rung and its base share one window length).
    rung = Timing(1.0, [0.3, 0.004, 0.002, 0.002], [True, False, False, False])
    base = Timing(0.5, [0.01, 0.01], [False, False])
    assert timer.sizing_step_s(rung, base) == pytest.approx(0.002)  # the compiling warm-up step is left out
    assert timer.sizing_step_s(Timing(0.25, [], [])) == 0.25  # no steady warm-up step: the first (fewer steps)
    recorded = Timing(1.0, [0.2, 0.002], [False, False], warmup_recorded=[True, False])
    assert timer.sizing_step_s(recorded) == pytest.approx(0.002)  # a step that recorded graphs is not steady


def test_warm_up_steps_that_record_cuda_graphs_count_as_compile_time():
    compiler, recorder = FakeCompiler(), FakeCompiler()
    calls = []

    def step():
        calls.append(1)
        if len(calls) == 1:
            compiler.n += 1  # the first step compiles
        if len(calls) == 2:
            recorder.n += 1  # the next records the graphs: no compile counted, and not yet steady

    timing = timer.warm_up(step, CPU, warmup=2, max_warmup=10, counter=compiler, recordings=recorder)
    assert timing.warmup_recorded == [True, False, False]  # two quiet steps after the recording one
    assert timing.warmup_compiled == [False, False, False]
    # compile s: the first step and the recording step, each less a steady step.
    t = Timing(1.0, [0.5, 0.01, 0.01], [False, False, False], warmup_recorded=[True, False, False])
    assert timer.compile_seconds(t, 0.01) == pytest.approx((1.0 - 0.01) + (0.5 - 0.01))
    assert timer.compile_seconds(dataclasses.replace(t, warmup_recorded=[]), 0.01) == pytest.approx(0.99)


def test_graph_recordings_are_counted_through_dynamos_recording_callbacks():
    """The counter hears torch's own trigger (the one cudagraph trees fire around each recording) and no other."""
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    with counters.graph_recordings() as recorded:
        with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "0/0"):
            pass
        with callback_handler.install_callbacks(CallbackTrigger.DYNAMO, "0/1"):
            pass
        assert recorded() == 1
    assert all(cb.__name__ != "on_start" for cb in callback_handler.start_callbacks)  # removed after


def test_the_fp8_peak_is_blended_by_flop_share_with_gpt2s_shapes(fp8_any_size):
    """GPT-2 124M at T=1024 on an H200: the block linears (fp8) are 60% of the FLOPs, the head and attention
    (bf16) the rest; the step's peak is the FLOP-weighted harmonic blend, between bf16's and fp8's."""
    from speedladder.models.gpt import GPT
    from speedladder.models.presets import PRESETS
    from speedladder.rungs import float8_matmul_params

    with torch.device("meta"):
        gpt2 = GPT(PRESETS["gpt2-124m"].model)
    # By hand, per layer: qkv 768x2304, proj 768x768, fc 768x3072, fc2 3072x768 = 7,077,888 weights; x 12 layers.
    assert float8_matmul_params(gpt2) == 12 * 7_077_888 == 84_934_656
    total = definition.flops_per_token(123_653_376, 12, 12, 64, 1024)  # 855,166,464
    fp8 = 6 * 84_934_656  # 509,607,936: 59.6% of the step
    peaks = {"fp8": peakflops.peak_tflops("NVIDIA H200", "fp8"), "bf16": peakflops.peak_tflops("NVIDIA H200", "bf16")}
    blended = peakflops.blended_peak({"fp8": fp8, "bf16": total - fp8}, peaks)
    # 855,166,464 / (509,607,936 / 1978.9 + 345,558,528 / 989.4) = 1409.35 TFLOP/s
    assert blended == pytest.approx(1409.35, abs=0.01)
    assert 989.4 < blended < 1978.9
    assert peakflops.blended_peak({"fp8": fp8, "bf16": total - fp8}, {**peaks, "fp8": None}) is None  # no guess
    assert peakflops.blended_peak({"bf16": total}, peaks) == 989.4  # one precision: its own peak


def test_windows_are_sized_from_a_timed_step_and_the_size_is_recorded(tiny):
    """measure_spec on CUDA sizes its windows from the warm-up (size_windows=True stands in for CUDA here): a rung
    and its base re-timed beside it share one window length, recorded with the step time it came from."""
    from speedladder.config.run import RunConfig, TimingConfig
    from speedladder.step.measurement import measure_spec
    from speedladder.step.workload import prepare

    work = prepare(RunConfig(preset="tiny", device="cpu", timing=TimingConfig(windows=3, min_window_s=0.05)))
    configured = work.cfg.run.timing.steps
    spec = dataclasses.replace(work.base_spec, autocast="bf16")
    m, _ = measure_spec(work, spec, lambda msg: None, base=work.base_spec, size_windows=True)
    for t in (m.timing, m.base_timing):
        assert t.min_window_s == 0.05 and t.sized_from_step_s is not None
        assert t.window_steps == timer.window_steps(configured, t.sized_from_step_s, 0.05) >= configured
        assert all(w.steps == t.window_steps for w in t.windows)
    assert m.timing.sized_from_step_s == timer.sizing_step_s(m.timing, m.base_timing)
    # Off CUDA by default: the configured steps, and nothing said about sizing.
    m, _ = measure_spec(tiny, tiny.base_spec, lambda msg: None)
    assert m.timing.window_steps == tiny.cfg.run.timing.steps and m.timing.sized_from_step_s is None
    assert all(w.steps == tiny.cfg.run.timing.steps for w in m.timing.windows)


def test_compiled_code_is_forgotten_before_the_cuda_cache_is_emptied(monkeypatch):
    """The CUDA graphs' pools that compiled code holds are freed by the reset, so the cache is emptied after it."""
    from speedladder.step import workload

    order = []
    monkeypatch.setattr(torch.compiler, "reset", lambda: order.append("reset"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: order.append("empty_cache"))
    workload.free_device_memory(torch.device("cuda"))
    assert order == ["reset", "empty_cache"]
    order.clear()
    workload.free_device_memory(CPU)
    assert order == ["reset"]


# -- compile estimates, by mode and cache state ------------------------------------------------------------------

# The H200 run of 2026-12-04 at 837fae3 (d2l-512, 6 blocks of 4 distinct Linears), each compiled rung's first step and
# warm-up in seconds, and the graphs its warm-up took from a cache: compile (fp32) 14.15, cold; bf16 15.13, cold, its
# base (compile, fp32) beside it 1.14, warm (3 hits); then in a fresh process, cudagraphs (bf16, reduce-overhead)
# 13.61, cold; muon (the same graph, another optimizer) 0.89, warm (3 hits); max-autotune stopped by its cap after
# 85 s, 14 matmul shapes autotuned.
H200_WARMUPS = {"compile": (14.15, 0), "bf16": (15.13, 0), "bf16 base": (1.14, 3), "cudagraphs": (13.61, 0),
                "muon": (0.89, 3)}


def _warmup(name: str) -> Timing:
    seconds, hits = H200_WARMUPS[name]
    return Timing(first_step_s=seconds, warmup_step_s=[], warmup_compiled=[], cache_hits=hits)


def test_the_cold_compile_model_gives_the_plans_figures():
    """bench/plan.txt's cold compiles on the H200, from the same model: tiny fp32 9 s; d2l-512 fp32 14, bf16 17,
    bf16 with checkpointing 22, bf16 with fp8 26; GPT-2 bf16 27. max-autotune adds 5 s a matmul shape (21 for a GPT
    with hand-written attention, 15 under SDPA); a CPU's kernels are its C++ compiler's, and its autotuning is not
    counted."""
    from speedladder.measure import compiletime as ct

    fp32, bf16 = StepSpec(64, 128, compile=True), StepSpec(64, 128, compile=True, autocast="bf16")
    ckpt = dataclasses.replace(bf16, transforms=("activation-checkpointing",))
    fp8 = dataclasses.replace(bf16, transforms=("float8",))
    assert ct.cold_s(fp32, 2, 4, ct.CUDA) == pytest.approx(9.4, abs=0.05)
    assert [round(ct.cold_s(s, 6, 4, ct.CUDA)) for s in (fp32, bf16, ckpt, fp8)] == [14, 17, 22, 26]
    assert round(ct.cold_s(bf16, 12, 4, ct.CUDA)) == 27
    tuned = dataclasses.replace(bf16, compile_mode="max-autotune")
    assert ct.matmul_shapes(tuned, 4) == 21 and ct.matmul_shapes(dataclasses.replace(tuned, transforms=("sdpa",)), 4) == 15
    assert ct.cold_s(tuned, 6, 4, ct.CUDA) == pytest.approx(ct.cold_s(bf16, 6, 4, ct.CUDA) + ct.RECORD_S + 21 * 5.0)
    assert ct.cold_s(fp32, 6, 4, ct.CPU) == pytest.approx(5.3 + 2.8 * 6 + 39.0)  # d2l-512 measured 60.2 s cold
    assert ct.cold_s(dataclasses.replace(fp32, compile_mode="max-autotune"), 6, 4, ct.CPU) == ct.cold_s(fp32, 6, 4, ct.CPU)


def test_compile_estimates_are_keyed_by_mode_and_cache_state():
    """The H200 ladders replayed with their measured warm-ups: the estimate that was shown (the previous compiled
    rung's warm-up, whatever its mode or cache) said about 0:14 for muon's warm compile (0.89 s) and about 0:01 for
    max-autotune's cold one (more than 85 s); keyed by mode and cache state, each is within its own kind."""
    from speedladder.measure import compiletime as ct

    est = ct.Estimates("cuda", blocks=6, block_linears=4)
    fp32, bf16 = StepSpec(64, 128, compile=True), StepSpec(64, 128, compile=True, autocast="bf16")
    assert est.estimate(StepSpec(64, 128)) is None  # nothing compiles
    assert est.cache_state(fp32) == ct.COLD and est.estimate(fp32) == pytest.approx(13.84, abs=0.01)
    est.note((fp32, _warmup("compile")), (None, None))
    # bf16: cold, from the model scaled by how far the last cold compile of its mode was off (14.15 / 13.84).
    assert est.estimate(bf16) == pytest.approx(17.38 * 14.15 / 13.84, rel=1e-3)
    assert est.cache_state(fp32) == ct.WARM
    est.note((bf16, _warmup("bf16")), (fp32, _warmup("bf16 base")))
    assert est.measured[(ct.DEFAULT, ct.WARM)] == 1.14 and est.estimate(fp32) == 1.14  # warm: as measured warm

    est = ct.Estimates("cuda", blocks=6, block_linears=4)  # the CUDA ladder, in a process of its own
    graphs = dataclasses.replace(bf16, compile_mode="reduce-overhead")
    muon = dataclasses.replace(graphs, optimizer="muon")
    tuned = dataclasses.replace(muon, compile_mode="max-autotune")
    assert est.estimate(graphs) == pytest.approx(18.38, abs=0.01)
    est.note((graphs, _warmup("cudagraphs")), (StepSpec(64, 128, autocast="bf16"), _warmup("bf16 base")))
    assert est.cache_state(muon) == ct.WARM  # the same graph: the optimizer is not compiled
    assert est.estimate(muon) == pytest.approx(1.5)  # no warm compile measured yet: a lead by the blocks
    est.note((muon, _warmup("muon")), (graphs, None))
    assert est.estimate(muon) == 0.89
    assert est.cache_state(tuned) == ct.COLD and est.estimate(tuned) == pytest.approx(123.38, abs=0.01)  # over 85 s: it was
    # A shape or a micro-batch is a graph of its own; accumulation's micro-batch is the base's graph.
    assert est.cache_state(dataclasses.replace(graphs, batch_size=512)) == ct.COLD
    assert est.cache_state(dataclasses.replace(graphs, batch_size=512, accum=8)) == ct.WARM


def test_blocks_and_their_linears_are_counted_from_the_weights():
    from speedladder.config.run import RunConfig
    from speedladder.measure import compiletime as ct
    from speedladder.step.workload import prepare

    work = prepare(RunConfig(preset="tiny", device="cpu"))
    assert ct.model_counts(work.init, work.model.blocks_prefix) == (2, 4)  # qkv, proj, fc, fc2
    assert ct.model_counts(work.init, None) == (0, 0)
    est = ct.of("cpu", work.init, "blocks.")
    assert (est.blocks, est.block_linears, est.host) == (2, 4, ct.CPU)
