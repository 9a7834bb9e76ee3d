"""nanoGPT's recipe beside the default on one training step, timed side by side: a benchmark, not a unit test (these
machines are shared).

    python bench/recipe.py [--preset d2l-cpu] [--rungs eager] [--threads 2] [--windows 7]

The same spec is built twice on one workload's model, data and initial weights: once under the default recipe
(torch's AdamW, a constant rate), once under `--recipe nanogpt` (the 2-D decay split, betas (0.9, 0.95), clipping
at norm 1, a cosine schedule). Both are warmed up and timed in interleaved windows (A B B A ..., measure/timer's
interleave), so their ratio carries the machine's drift on both sides. Then clip_grad_norm_ alone, on the step's
own gradients, beside a whole step: the most a faster clipping (a clip-foreach rung) could save. Prints the
figures; docs/benchmarks.md records a run.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from speedladder.config.recipe import RecipeConfig
from speedladder.config.run import RunConfig
from speedladder.measure import judging, timer
from speedladder.rungs import compose
from speedladder.step.schedule import Span
from speedladder.step.workload import prepare


def fastest_per_call(fn, calls: int, repeats: int = 5) -> float:
    """Seconds per call, the fastest of `repeats` blocks of `calls` back-to-back calls (another process on the cores
    only slows a block)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="d2l-cpu")
    p.add_argument("--rungs", default="eager", help="the rungs the spec composes to, e.g. eager,bf16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--windows", type=int, default=7)
    p.add_argument("--window-steps", type=int, default=10)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    names = tuple(n for n in a.rungs.split(",") if n and n != "eager")
    default = prepare(RunConfig(preset=a.preset, device="cpu", rungs=("eager", *names)))
    nanogpt = dataclasses.replace(default, cfg=default.cfg.with_run(dataclasses.replace(
        default.cfg.run, recipe=RecipeConfig.named("nanogpt"))))
    g = default.cfg.run.gates
    nanogpt.with_horizon(Span(g.learns_steps or g.loss_steps, "steps"))  # as `run` makes it: its learns-check
    spec = compose(names, default.base_spec, default.env)
    steps = {"default": default.step(spec), "nanogpt": nanogpt.step(spec)}
    runs = {k: timer.stepper(s, default.stream(spec)) for k, s in steps.items()}
    cpu = torch.device("cpu")
    timings = {k: timer.warm_up(r, cpu, 3, 20) for k, r in runs.items()}
    timer.interleave(runs["nanogpt"], runs["default"], timings["nanogpt"], timings["default"], cpu,
                     spec.tokens_per_step, spec.tokens_per_step, a.window_steps, a.windows)
    rates = {k: judging.tokens_per_s(t) for k, t in timings.items()}
    assert rates["default"] is not None and rates["nanogpt"] is not None
    ratios = [n.tokens_per_s / d.tokens_per_s for n, d in zip(timings["nanogpt"].windows, timings["default"].windows)]
    print(f"{a.preset} {'+'.join(('eager', *names))} on {torch.get_num_threads()} threads, {a.windows} windows of "
          f"{a.window_steps} steps, interleaved:")
    for k, r in rates.items():
        print(f"  {k:8s} {r.median:9,.0f} tokens/s (min {r.min:,.0f}, max {r.max:,.0f})")
    print(f"  nanogpt / default: median {rates['nanogpt'].median / rates['default'].median:.3f}, per window pair "
          f"{min(ratios):.3f}-{max(ratios):.3f} (median {statistics.median(ratios):.3f})")
    step = steps["nanogpt"]
    x, y = next(default.stream(spec))
    step.forward_backward(x, y)
    grads = [q for q in step.params.values() if q.grad is not None]
    clip = fastest_per_call(lambda: torch.nn.utils.clip_grad_norm_(grads, 1e9), 200)
    clip_foreach = fastest_per_call(lambda: torch.nn.utils.clip_grad_norm_(grads, 1e9, foreach=True), 200)
    whole = fastest_per_call(lambda: runs["nanogpt"](), 10)
    print(f"  clip_grad_norm_ over {len(grads)} gradients: {clip * 1e3:.3f} ms (foreach=True {clip_foreach * 1e3:.3f} ms)"
          f" against a whole step's {whole * 1e3:.1f} ms: {clip / whole:.2%} of the step")


if __name__ == "__main__":
    main()
