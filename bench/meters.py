"""The meters against known quantities on the real clock: a benchmark, not a unit test (these machines are shared).

    python bench/meters.py

1. A step that sleeps 20 ms must time as 20 ms: tokens/s = tokens / 0.02 (optimum-benchmark's check).
2. The profile runs in a child process: windows timed after it pay nothing for it, while the same windows under
   an in-process profiler are far slower (the source text's trap, measure.md rule 5).
Prints the figures and exits 1 when one is off; docs/benchmarks.md records a run.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch
from torch.profiler import profile as torch_profile

from speedladder.config.run import RunConfig
from speedladder.measure import judging, timer
from speedladder.profile import step_profile
from speedladder.step.workload import prepare

CPU = torch.device("cpu")


def windows(step, tokens_per_step: int, steps: int, n: int) -> timer.Timing:
    timing = timer.warm_up(step, CPU, 1, 5)
    timing.windows = [timer.time_window(step, CPU, tokens_per_step, steps) for _ in range(n)]
    return timing


def sleep_check() -> bool:
    t = windows(lambda: time.sleep(0.02), 1000, 5, 5)
    rate, ms = judging.tokens_per_s(t), judging.step_ms(t)
    ok = 0.85 * 50_000 < rate.median <= 1.01 * 50_000 and abs(ms - 20) < 3  # sleep can overshoot, never undershoot
    print(f"sleep 20 ms: step {ms:.2f} ms, {rate.median:,.0f} tokens/s (50,000 expected): {'ok' if ok else 'OFF'}")
    return ok


def profile_tax_check() -> bool:
    torch.set_num_threads(1)
    work = prepare(RunConfig(preset="tiny", device="cpu", rungs=("eager",)))
    step, stream = work.step(work.base_spec), work.stream(work.base_spec)
    run = timer.stepper(step, stream)

    def rates() -> list[float]:
        return [w.tokens_per_s for w in windows(run, work.base_spec.tokens_per_step, 20, 7).windows]

    before = rates()
    with tempfile.TemporaryDirectory() as tmp:
        step_profile.run_in_child(RunConfig(preset="tiny", device="cpu", rungs=("eager",)), (), Path(tmp) / step_profile.TRACE,
                           timeout_s=300)
    after = rates()
    with torch_profile(record_shapes=True, with_flops=True, with_stack=True):
        taxed = rates()
    base = statistics.median(before)
    child_ratio, taxed_ratio = statistics.median(after) / base, statistics.median(taxed) / base
    ok = child_ratio > 0.8 and taxed_ratio < child_ratio
    print(f"after a child process's profile: {child_ratio:.2f}x the windows before; under an in-process profiler: "
          f"{taxed_ratio:.2f}x: {'ok' if ok else 'OFF'}")
    return ok


if __name__ == "__main__":
    sys.exit(0 if all([sleep_check(), profile_tax_check()]) else 1)
