"""The `predict` and `ddp` commands: their flag groups (ParallelConfig's fields) and their thin bodies."""

from __future__ import annotations

import argparse

from speedladder.cli.cmd_run import finish
from speedladder.cli.gen import Command
from speedladder.codec import Group
from speedladder.config.run import RunConfig
from speedladder.config.settings import Settings
from speedladder.parallel import launch
from speedladder.progress import show_on_stderr

WORKLOAD = (Group.MODEL, Group.RUNG_FILES, Group.RECIPE, Group.BATCH, Group.TIMING, Group.WARMUP, Group.MAX_WARMUP, Group.PARALLEL,
            Group.TORCHRUN, Group.OUTPUT, Group.QUIET)


def composed(s: Settings) -> RunConfig:
    """The run whose rungs each process runs, composed: --compose's, else the run's (a config file's, or the
    default ladder's)."""
    return s.run if s.parallel.rungs is None else s.run.with_rungs(s.parallel.rungs)


def cmd_predict(s: Settings, _: argparse.Namespace) -> int:
    run_dir = launch.run_predict(composed(s), s.parallel, show_on_stderr(s.quiet))
    finish(run_dir)
    return 0


def cmd_ddp(s: Settings, _: argparse.Namespace) -> int:
    run_dir = launch.run_ddp(composed(s), s.parallel, show_on_stderr(s.quiet))
    if run_dir is None:
        print("this node's ranks finished; rank 0 ran on another node, whose run folder holds the results")
        return 0
    finish(run_dir)
    return 0


COMMANDS = (
    Command("predict", "price data parallelism for k processes before launching it",
            "Measure one process's tokens/s for the chosen rungs, get the allreduce bandwidth, and print for each k "
            "the gradient bytes, t_comm, t_compute, the no-overlap floor, an overlap-aware estimate and the scaling "
            "efficiency.", (*WORKLOAD, Group.PREDICT), cmd_predict),
    Command("ddp", "launch k processes with torchrun and compare measured tokens/s with the prediction",
            "Measure one process, then launch K processes through torchrun (NCCL on CUDA, gloo on the CPU): an "
            "allreduce probe, the prediction, then the same timed windows as `run` for the whole job; results.json "
            "(`parallel`) and scaling.png.", (*WORKLOAD, Group.DDP), cmd_ddp),
)
