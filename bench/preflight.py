"""The GPU plan's first step: is the device there, does a training step run eager and compiled, what is installed.

    python bench/preflight.py [--device cpu] [--no-compile]

On the device `auto` picks (CUDA on the GPU machine): the device, its compute capability and memory, the versions
of torch, Triton and torchao, then one eager step and one compiled step of the tiny preset, each timed, and what
the fp8 rung would say here (with torchao: one rowwise fp8 Linear forward and backward). Exit 1, with one line,
when the GPU plan would waste its minutes: no CUDA device (unless --device cpu), or a step that fails. The fp8
check only reports.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import sys
import time

import torch

from speedladder.config import RunConfig
from speedladder.rungs import RUNGS
from speedladder.workload import prepare


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def timed_step(work, spec) -> float:
    """Seconds of one training step from a fresh build: the first step, with its compile if any."""
    step, stream = work.step(spec), work.stream(spec)
    if work.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    float(step(*next(stream)))  # read back: the step has really run
    return time.perf_counter() - t0


def fp8_check(work) -> str:
    """One rowwise fp8 Linear forward and backward, where the fp8 rung could run; else why it cannot."""
    unmet = RUNGS["fp8"].requires.unmet(work.env)
    if unmet:
        return f"fp8 rung: {unmet}"
    from speedladder.rungs import float8_linears

    layer = float8_linears(torch.nn.Sequential(torch.nn.Linear(256, 256)), prefix="").to(work.device)
    x = torch.randn(64, 256, device=work.device, requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        layer(x).float().pow(2).mean().backward()
    torch.cuda.synchronize()
    return f"fp8 rung: a rowwise fp8 Linear ran forward and backward ({type(layer[0]).__name__})"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled step (a CPU smoke run)")
    args = p.parse_args(argv)
    work = prepare(RunConfig(preset="tiny", device=args.device))
    dev = work.device
    print(f"python {sys.version.split()[0]}; torch {torch.__version__} (CUDA {torch.version.cuda}); triton "
          f"{version('triton')}; torchao {version('torchao')}")
    if args.device == "auto" and dev.type != "cuda":
        print(f"preflight FAILED: no CUDA device (torch sees {dev.type}); the GPU plan stops here")
        return 1
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        print(f"device {props.name}, compute capability {props.major}.{props.minor}, "
              f"{props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs")
    try:
        print(f"eager step (tiny): {timed_step(work, work.base_spec):.2f} s")
        if not args.no_compile:
            spec = dataclasses.replace(work.base_spec, compile=True)
            print(f"compiled step (tiny, the first, its cold compile in it): {timed_step(work, spec):.1f} s")
    except Exception as e:  # noqa: BLE001 -- said in one line; the plan stops rather than fail rung by rung
        print(f"preflight FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return 1
    try:
        print(fp8_check(work))
    except Exception as e:  # noqa: BLE001 -- reported: the fp8 rung will say the same in its row
        print(f"fp8 rung: a rowwise fp8 Linear failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    print("preflight passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
