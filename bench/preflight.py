"""The GPU plan's first step: is the device there, does a training step run eager and compiled, what is installed.

    python bench/preflight.py [--device cpu] [--no-compile] [--estimate S] [--sleep S]

Each phase is timed and printed as it ends, so a preflight cut by its cap still says how far it got and how long
each phase took: importing torch and speedladder, creating the CUDA context, preparing the tiny preset, one
eager step, one compiled step (its cold compile in it: on CUDA the first Triton compile, the compile workers
started), and what the fp8 rung would say here (with torchao: one rowwise fp8 Linear forward and backward).

Exit 1, with one line, only on a real failure of the environment: torch does not import, no CUDA device (unless
--device cpu), or a step or the compile fails. The fp8 check only reports. A preflight stopped by its cap (SIGINT)
says so and exits 130: slow is not broken, and bench/gpu.sh goes on with the plan. --estimate: the plan's
seconds, printed beside the total. --sleep: seconds of planted delay after the phases (the test of a slow
preflight).
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

# After the clock: the import phase is timed from the process's first line.
import argparse
import dataclasses
import importlib.metadata
import sys

PHASES: list[tuple[str, float]] = []
NOW = ["starting"]  # the phase under way, named if the cap stops it


def phase(name: str, seconds: float, detail: str = "") -> None:
    PHASES.append((name, seconds))
    print(f"phase {name}: {seconds:.1f} s" + (f" ({detail})" if detail else ""), flush=True)


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def timed_step(torch, work, spec) -> float:
    """Seconds of one training step from a fresh build: the first step, with its compile if any."""
    step, stream = work.step(spec), work.stream(spec)
    if work.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    float(step(*next(stream)))  # read back: the step has really run
    return time.perf_counter() - t0


def fp8_check(torch, work) -> str:
    """One rowwise fp8 Linear forward and backward (eager: its compile is the rung's), where the fp8 rung could
    run; else why it cannot. 4096 x 4096: a shape torchao's rowwise filter keeps (N > 4096 or K > 2048 beyond
    N > 2048 and K > 1024)."""
    from speedladder.rungs import RUNGS, float8_linears

    unmet = RUNGS["fp8"].requires.unmet(dataclasses.replace(work.env, model=None))  # the device's, not tiny's
    if unmet:
        return f"fp8 rung: {unmet}"
    layer = float8_linears(torch.nn.Sequential(torch.nn.Linear(4096, 4096)), prefix="").to(work.device)
    x = torch.randn(64, 4096, device=work.device, requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        layer(x).float().pow(2).mean().backward()
    torch.cuda.synchronize()
    return f"fp8 rung: a rowwise fp8 Linear 4096x4096 ran forward and backward ({type(layer[0]).__name__})"


def checks(args: argparse.Namespace) -> int:
    NOW[0] = "import"
    try:
        import torch

        from speedladder.config.run import RunConfig
        from speedladder.step.workload import prepare
    except Exception as e:  # noqa: BLE001 -- no torch, or a broken one: the plan cannot run
        print(f"preflight FAILED: torch or speedladder does not import: {one_line(e)}")
        return 1
    phase("import", time.perf_counter() - T0, f"python {sys.version.split()[0]}, torch {torch.__version__} "
          f"(CUDA {torch.version.cuda}), triton {version('triton')}, torchao {version('torchao')}")

    NOW[0] = "cuda context"
    t = time.perf_counter()
    if args.device != "cpu":
        if not torch.cuda.is_available():
            print("preflight FAILED: no CUDA device (torch.cuda.is_available() is False); the GPU plan stops here")
            return 1
        try:
            torch.zeros(1, device="cuda").add_(1)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 -- a driver or device that does not answer
            print(f"preflight FAILED: the CUDA context: {one_line(e)}")
            return 1
        props = torch.cuda.get_device_properties(0)
        phase("cuda context", time.perf_counter() - t, f"{props.name}, compute capability {props.major}."
              f"{props.minor}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs")
    try:
        NOW[0] = "workload"
        t = time.perf_counter()
        work = prepare(RunConfig(preset="tiny", device=args.device))
        phase("workload", time.perf_counter() - t, f"the tiny preset on {work.device}")
        NOW[0] = "eager step"
        phase("eager step", timed_step(torch, work, work.base_spec), "tiny, the first")
        if not args.no_compile:
            NOW[0] = "first compile"
            spec = dataclasses.replace(work.base_spec, compile=True)
            phase("first compile", timed_step(torch, work, spec), "tiny's first compiled step, 2 blocks, cold")
    except Exception as e:  # noqa: BLE001 -- said in one line; the plan stops rather than fail rung by rung
        print(f"preflight FAILED: {NOW[0]}: {one_line(e)}")
        return 1
    NOW[0] = "fp8 check"
    t = time.perf_counter()
    try:
        line = fp8_check(torch, work)
    except Exception as e:  # noqa: BLE001 -- reported: the fp8 rung will say the same in its row
        line = f"fp8 rung: a rowwise fp8 Linear failed: {one_line(e)}"
    phase("fp8 check", time.perf_counter() - t, line)
    if args.sleep:
        NOW[0] = "planted sleep"
        time.sleep(args.sleep)
    total = time.perf_counter() - T0
    print(f"preflight passed in {total:.1f} s" + (f" (estimate {args.estimate:g} s)" if args.estimate else ""))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", choices=("auto", "cpu"), help="auto (CUDA, or a failure) or cpu")
    p.add_argument("--no-compile", action="store_true",
                   help="skip the compiled step (the GPU plan's: its first compile rung measures a cold compile)")
    p.add_argument("--estimate", type=float, default=None, help="the plan's estimate in seconds, printed beside")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds of planted delay after the phases")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        return checks(args)
    except KeyboardInterrupt:  # the plan's cap: what was measured is printed above
        print(f"preflight capped during {NOW[0]} after {time.perf_counter() - T0:.1f} s: slow, not failed; phases "
              "done: " + (", ".join(f"{n} {s:.1f} s" for n, s in PHASES) or "none"), flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
