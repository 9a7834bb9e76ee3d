"""Cold and warm compile seconds of one training step on this machine: what bench/plan.txt's estimates scale.

    python bench/compile_cost.py [--preset d2l-512] [--layers 2,6] [--batch-size 2] [--seq-len N]
                                 [--rungs compile,compile+bf16] [--device cpu] [--json FILE]

Each point (a number of blocks and a set of rungs, applied to eager as the ladder applies them) runs in a fresh
process with an empty inductor cache (TORCHINDUCTOR_CACHE_DIR) and one compile thread, and gives one row:

  cold s     the first step less a steady one: dynamo, AOTAutograd, inductor and the kernel compiler, all cold
  kernel s   of which the kernel compiler's own calls (the C++ compiler on a CPU; not split out on CUDA)
  python s   the rest: tracing, the joint graph, lowering and scheduling, in Python
  kernels    distinct kernels generated (forward and backward graphs together)
  warm s     the same step rebuilt after torch.compiler.reset(), the caches on disk warm: how the ladder's base,
             re-timed beside the rung built on it, compiles

The shapes (batch, sequence) only size the tensors here: the graphs and their kernels are those of the preset's
shapes, so a small batch keeps the steps short on a CPU. Bad input is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KERNEL_DEF = ("= async_compile.cpp_pybinding(", "= async_compile.cpp(", "= async_compile.triton(")


def child(point: dict) -> dict:
    """One point, in this (fresh) process: the cold compile, its parts, then the warm one."""
    import torch

    from speedladder.config.run import RunConfig
    from speedladder.rungs import compose
    from speedladder.step.workload import free_device_memory, prepare

    kernel_s = [0.0]
    try:  # the C++ compiler's calls, timed where they happen (one compile thread: in this process)
        from torch._inductor import cpp_builder

        build = cpp_builder.CppBuilder.build

        def timed_build(self) -> None:
            t0 = time.perf_counter()
            try:
                build(self)
            finally:
                kernel_s[0] += time.perf_counter() - t0

        cpp_builder.CppBuilder.build = timed_build  # type: ignore[method-assign]
    except (ImportError, AttributeError):
        kernel_s[0] = float("nan")

    changes = {"n_layer": point["layers"]} if point["layers"] else None
    work = prepare(RunConfig(preset=point["preset"], device=point["device"], batch_size=point["batch_size"],
                             seq_len=point["seq_len"], model_changes=changes))
    spec = compose(tuple(point["rungs"]), work.base_spec, work.env)
    stream = work.stream(spec)

    def sync() -> None:
        if work.device.type == "cuda":
            torch.cuda.synchronize()

    def first_and_steady() -> tuple[float, float]:
        step = work.step(spec)
        sync()
        t0 = time.perf_counter()
        float(step(*next(stream)))
        first = time.perf_counter() - t0
        steady = []
        for i in range(5):
            t0 = time.perf_counter()
            float(step(*next(stream)))
            if i >= 2:
                steady.append(time.perf_counter() - t0)
        return first, statistics.median(steady)

    first, steady = first_and_steady()
    cold, kernel = first - steady, kernel_s[0]
    if work.device.type == "cuda":
        kernel = float("nan")
    cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    kernels = set()
    for code in cache.rglob("*.py"):
        for line in code.read_text(errors="replace").splitlines():
            if any(k in line for k in KERNEL_DEF):
                kernels.add((code.name, line.split("=")[0].strip()))
    free_device_memory(work.device)
    warm_first, warm_steady = first_and_steady()
    model = work.cfg.model
    return {**point, "blocks": model.n_layer if model else None, "width": model.n_embd if model else None,
            "spec": spec.to_dict(), "torch": torch.__version__, "device_name": str(work.device),
            "cold_s": cold, "kernel_s": kernel, "python_s": None if math.isnan(kernel) else cold - kernel,
            "kernels": len(kernels), "warm_s": warm_first - warm_steady, "step_s": steady}


def run_point(point: dict, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="speedladder-inductor-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": str(Path(cache) / "triton"),
               "TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONUNBUFFERED": "1",
               # one intra-op thread: on a shared CPU two spinning OpenMP threads can make a steady step 100x longer
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        src = str(Path(__file__).resolve().parents[1] / "src")
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(point)], env=env, text=True,
                              capture_output=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {**point, "error": tail}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def row(r: dict) -> str:
    if "error" in r:
        return f"{r['preset']:<10} {r['layers'] or '-':>6} {'+'.join(r['rungs']):<24} error: {r['error']}"

    def f(x: float | None) -> str:
        return "—" if x is None or math.isnan(x) else f"{x:.1f}"

    return (f"{r['preset']:<10} {r['blocks']:>6} {'+'.join(r['rungs']):<24} {f(r['cold_s']):>7} {f(r['kernel_s']):>8} "
            f"{f(r['python_s']):>8} {r['kernels']:>7} {f(r['warm_s']):>6} {r['step_s']:>7.3f}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="d2l-512")
    p.add_argument("--layers", default="", help="blocks to build, comma-separated (default: the preset's)")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--rungs", default="compile", help="comma-separated points, each rungs joined by '+'")
    p.add_argument("--device", default="cpu")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a point may take")
    p.add_argument("--json", type=Path, help="append each point's row as a JSON line here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    from speedladder.models.presets import PRESETS
    from speedladder.rungs import RUNGS

    if args.preset not in PRESETS:
        print(f"compile_cost: unknown preset {args.preset!r} (choose from {', '.join(PRESETS)})", file=sys.stderr)
        return 2
    try:
        layers = [int(x) for x in args.layers.split(",") if x] or [None]
    except ValueError:
        print(f"compile_cost: --layers takes whole numbers, got {args.layers!r}", file=sys.stderr)
        return 2
    points = [tuple(r.split("+")) for r in args.rungs.split(",") if r]
    unknown = sorted({n for pt in points for n in pt} - set(RUNGS))
    if unknown or not points:
        print(f"compile_cost: unknown rung(s) {', '.join(unknown) or '(none given)'}", file=sys.stderr)
        return 2
    print(f"{'preset':<10} {'blocks':>6} {'rungs':<24} {'cold s':>7} {'kernel s':>8} {'python s':>8} "
          f"{'kernels':>7} {'warm s':>6} {'step s':>7}")
    for n in layers:
        for rungs in points:
            point = {"preset": args.preset, "layers": n, "rungs": list(rungs), "device": args.device,
                     "batch_size": args.batch_size, "seq_len": args.seq_len}
            r = run_point(point, args.timeout)
            print(row(r), flush=True)
            if args.json is not None:
                with args.json.open("a") as f:
                    f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
