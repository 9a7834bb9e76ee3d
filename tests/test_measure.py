"""Part 6: the meters, tested against known quantities (docs/measurement.md, rules 1-4)."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from speedladder import measure
from speedladder.measure import Spread, Timing, Window

CPU = torch.device("cpu")


class FakeCompiler:
    """A compile counter that a fake step bumps on the calls we choose."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        return self.n


def test_sleep_of_known_length_times_right():
    """A step that sleeps 20 ms is 20 ms: tokens/s = tokens / 0.02 (the optimum-benchmark check)."""
    timing = measure.run_windows(lambda: time.sleep(0.02), CPU, tokens_per_step=1000, steps=5, windows=3,
                                 warmup=1, max_warmup=5, counter=FakeCompiler())
    rate = measure.tokens_per_s(timing)
    assert len(timing.windows) == 3
    assert all(w.steps == 5 and w.tokens == 5000 for w in timing.windows)
    assert 0.85 * 50_000 < rate.median < 1.01 * 50_000  # sleep can overshoot, never undershoot
    assert measure.step_ms(timing) == pytest.approx(20, rel=0.15)


def test_compilation_stays_out_of_the_windows_and_is_reported_apart():
    compiler = FakeCompiler()
    calls = []

    def step():
        calls.append(1)
        if len(calls) <= 2:  # "compiles" on its first two calls: forward, then a late recompile
            compiler.n += 1
            time.sleep(0.3)
        time.sleep(0.005)

    timing = measure.run_windows(step, CPU, 100, steps=4, windows=3, warmup=2, max_warmup=10, counter=compiler)
    assert timing.first_step_s > 0.3
    assert timing.warmup_compiled == [True, False, False]  # warm-up ran until 2 quiet steps in a row
    assert all(w.recompiles == 0 for w in timing.windows)
    assert all(w.seconds < 0.2 for w in timing.windows)  # no compile time inside
    compile_s = measure.compile_seconds(timing, measure.step_ms(timing) / 1e3)
    assert compile_s == pytest.approx(0.6, abs=0.1)


def test_warmup_gives_up_when_compilation_never_settles():
    compiler = FakeCompiler()

    def step():
        compiler.n += 1

    timing = measure.run_windows(step, CPU, 1, steps=2, windows=3, warmup=2, max_warmup=4, counter=compiler)
    assert not timing.settled
    assert len(timing.warmup_step_s) == 4


def test_a_window_that_recompiles_is_flagged_and_left_out():
    compiler = FakeCompiler()
    calls = []

    def step():
        calls.append(1)
        if len(calls) == 9:  # inside the second window (first step 1, warm-up 2-3, windows of 3 steps)
            compiler.n += 1
            time.sleep(0.05)

    timing = measure.run_windows(step, CPU, 10, steps=3, windows=3, warmup=2, max_warmup=5, counter=compiler)
    assert [w.recompiles for w in timing.windows] == [0, 1, 0]
    assert len(timing.clean_windows) == 2
    assert measure.tokens_per_s(timing).min > 30 / 0.05  # the slow window is not in the statistics


def test_real_recompiles_are_counted():
    f = torch.compile(lambda x: torch.sin(x) * 2, dynamic=False, backend="eager")
    sizes = iter(range(1, 100))
    timing = measure.run_windows(lambda: f(torch.ones(4)), CPU, 1, steps=2, windows=3, warmup=1, max_warmup=5)
    assert [w.recompiles for w in timing.windows] == [0, 0, 0]
    assert timing.first_step_s > 0
    timing = measure.run_windows(lambda: f(torch.ones(next(sizes) + 4)), CPU, 1, steps=2, windows=3, warmup=0,
                                 max_warmup=5)
    assert all(w.recompiles >= 1 for w in timing.windows)  # a new shape each call: never a clean window
    assert measure.tokens_per_s(timing) is None


def test_device_is_synchronized_at_window_edges_only(monkeypatch):
    log = []
    monkeypatch.setattr(measure, "sync", lambda device: log.append("sync"))
    measure.run_windows(lambda: log.append("step"), CPU, 1, steps=4, windows=3, warmup=1, max_warmup=5,
                        counter=FakeCompiler())
    timed = "".join("s" if e == "step" else "|" for e in log)
    # first step and the warm-up step are each synchronized; then every window is |ssss|.
    assert timed == "|s|" + "s|" + "|ssss|" * 3


def test_spread_and_verdicts():
    timing = Timing(0.0, [], [], [Window(1.0, 10, 1000, 0), Window(0.5, 10, 1000, 0), Window(2.0, 10, 1000, 0)])
    s = measure.tokens_per_s(timing)
    assert (s.median, s.min, s.max) == (1000, 500, 2000)
    base = Spread(100, 95, 105)
    assert measure.verdict(Spread(130, 120, 140), base) == "win"
    assert measure.verdict(Spread(80, 75, 85), base) == "loss"
    assert measure.verdict(Spread(103, 99, 110), base) == "noise"  # inside the spread is not a win


def test_flops_per_token_palm_convention():
    # GPT-2 124M at T=1024, by hand: 6 * 123,653,376 + 12 * 12 * 12 * 64 * 1024.
    assert measure.flops_per_token(123_653_376, 12, 12, 64, 1024) == 741_920_256 + 113_246_208


def test_flops_per_token_against_counted_flops(tiny):
    """6N + 12LHQT against the FLOPs torch counts in one forward and backward of the real model."""
    from speedladder.model import GPT

    cfg = tiny.cfg.model
    torch.manual_seed(0)
    model = GPT(cfg)
    idx = torch.randint(cfg.vocab_size, (4, cfg.block_size))
    counter = FlopCounterMode(display=False)
    with counter:
        _, loss = model(idx, idx)
        loss.backward()
    tokens = idx.numel()
    predicted = measure.flops_per_token(model.matmul_params(), cfg.n_layer, cfg.n_head, cfg.head_dim,
                                        cfg.block_size) * tokens
    # The formula also counts biases and LayerNorm weights as if they were matmul weights: a small excess.
    assert counter.get_total_flops() == pytest.approx(predicted, rel=0.05)


@pytest.mark.parametrize("name, model", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 SXM5 80GB", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA A100-SXM4-40GB", "A100"),
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A100-PCIE-40GB", "A100"),
    ("NVIDIA A100 80GB PCIe", "A100"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA GeForce RTX 4090", None),
    ("AMD EPYC 7B13", None),
])
def test_device_names_match_the_peak_table_exactly(name, model):
    assert measure.device_model(name) == model


def test_peak_table_and_mfu():
    assert measure.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert measure.peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert measure.peak_tflops("NVIDIA H100 NVL", "bf16") == 835.5  # not the SXM's figure
    assert measure.peak_tflops("NVIDIA H200", "tf32") == 494.7
    assert measure.peak_tflops("NVIDIA A100-SXM4-80GB", "fp32") == 19.5
    assert measure.peak_tflops("NVIDIA H200", "fp8") == 1978.9
    assert measure.peak_tflops("NVIDIA L40", "bf16") == 181.0 and measure.peak_tflops("NVIDIA L4", "bf16") == 121.0
    assert measure.peak_tflops("NVIDIA L40", "fp32") == 90.5  # not the L4's 30.3: MFU would be 3x too high
    assert measure.peak_tflops("NVIDIA A100-SXM4-80GB", "fp8") is None  # no float8 tensor cores
    assert measure.peak_tflops("AMD EPYC", "bf16") is None  # unknown: no MFU rather than a guess
    assert measure.mfu(100_000, 1_000_000_000, None) is None
    assert measure.mfu(500_000, 855_166_464, 989.4) == pytest.approx(500_000 * 855_166_464 / 989.4e12)


def test_a_given_peak_is_per_precision():
    given = {"bf16": 500.0, "fp32": 50.0}
    assert measure.peak_for(given, "NVIDIA H100 80GB HBM3", "cuda", "bf16") == 500.0
    assert measure.peak_for(given, "NVIDIA H100 80GB HBM3", "cuda", "tf32") is None  # not given: no MFU
    assert measure.peak_for(None, "NVIDIA H100 80GB HBM3", "cuda", "tf32") == 494.7
    assert measure.peak_for(None, "Intel Xeon", "cpu", "fp32") is None


def test_peak_memory_is_none_without_cuda():
    assert measure.peak_memory(CPU) is None
