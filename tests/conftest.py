from __future__ import annotations

import os

# One intra-op thread for the tests and every process they start (profile children, torchrun ranks, bench
# scripts): on a shared 2-core machine two OpenMP threads spin against whatever else runs and a tiny step can
# take 100x longer. The tests check behaviour and numbers, not speed (benchmarks measure speed).
os.environ["OMP_NUM_THREADS"] = "1"

import contextlib
import dataclasses
import io
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import torch

from speedladder.cli import main
from speedladder.config.resolved import Resolved, resolve
from speedladder.config.run import RunConfig
from speedladder.measure import counters, timer
from speedladder.models.gpt import GPTConfig
from speedladder.rungs import RUNGS, Capability, Rung
from speedladder.step.workload import Workload, prepare


def plant(monkeypatch: pytest.MonkeyPatch, name: str, fn: Callable[[torch.nn.Module], torch.nn.Module]) -> None:
    """A model transform under `name` for one test: the rung that owns the name with `fn` for its transform, else a
    speed rung of its own (MODEL_TRANSFORMS is an index of RUNGS, so the rung is what is planted)."""
    owner = next((r for r in RUNGS.values() if r.transform_name == name), None)
    planted = (dataclasses.replace(owner, model=fn) if owner else
               Rung(name=f"planted-{name}", reason="planted by a test", kind="speed", transform=lambda s, e: s,
                    model=fn, transform_name=name))
    monkeypatch.setitem(RUNGS, planted.name, planted)


@dataclasses.dataclass(frozen=True)
class Described:
    """A model as a rung's requirement reads it (rungs.ModelFacts), described by hand."""

    lacks: Mapping[Capability, str] = dataclasses.field(default_factory=dict)
    hooks: tuple[str, ...] = ()
    shapes: GPTConfig | None = None

torch.set_num_threads(1)

CPU = torch.device("cpu")


def resolved(**run: object) -> Resolved:
    """The saved configuration of a hand-made Results: the preset's workload on the CPU, with `run`'s changes."""
    return resolve(RunConfig(**run), CPU)  # type: ignore[arg-type]

# The arguments of a quick CPU run shared by the files that compare, check and draw saved runs (a file whose run
# differs keeps its own list).
TINY = ["--preset", "tiny", "--device", "cpu", "--no-profile", "--window-steps", "2", "--loss-steps", "4",
        "--learns-steps", "60", "--quiet"]


# -- helpers the test files share ------------------------------------------------------------------

def cli(*args: str) -> tuple[int, str, str]:
    """`speedladder ARGS` in this process: its exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def load_dict(path) -> dict:
    """A saved run as its file holds it, whatever version wrote it (what the page and the comparison read)."""
    from speedladder.records import storage, to_dict

    return to_dict(storage.load(path))


def swap_attention(cls: type[torch.nn.Module]) -> Callable[[torch.nn.Module], torch.nn.Module]:
    """A model transform that wraps every block's attention in `cls` (a planted attention, built from the old one)."""
    def transform(model: torch.nn.Module) -> torch.nn.Module:
        for block in model.blocks:
            block.attn = cls(block.attn)
        return model
    return transform


def header_of(out: str) -> str:
    """The title line of a printed run or race: the first line that names the tool (a note on a busy machine can
    come before it)."""
    return next(line for line in out.splitlines() if line.startswith("speedladder "))


def only_folder(parent: Path) -> Path:
    """The one run folder a command wrote under `parent`."""
    (folder,) = [p for p in Path(parent).iterdir() if p.is_dir()]
    return folder


def run_windows(step: Callable[[], object], device: torch.device, tokens_per_step: int, steps: int, windows: int,
                warmup: int, max_warmup: int, counter: Callable[[], int] = counters.compile_count) -> timer.Timing:
    """Warm up, then time `windows` windows of `steps` steps: what measurement.measure_spec does with a base-less spec,
    for the meters' own tests."""
    timing = timer.warm_up(step, device, warmup, max_warmup, counter)
    timing.windows = [timer.time_window(step, device, tokens_per_step, steps, counter) for _ in range(windows)]
    return timing


class Clock:
    """A clock the test moves: time.perf_counter reads it, and a fake step advances it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> Clock:
    """time.perf_counter on a clock the test moves: timings exact, whatever the machine is doing."""
    c = Clock()
    monkeypatch.setattr(time, "perf_counter", c)
    return c


@pytest.fixture
def fp8_any_size(monkeypatch) -> None:
    """torchao's size filter set aside (models/float8.py's `worth`): at the tests' small shapes it keeps no Linear,
    and what these tests check is fp8's arithmetic on the block Linears. Divisibility by 16 still applies."""
    monkeypatch.setattr("speedladder.models.float8.worth", lambda module, name, recipe: True)

# The files that take longest (cold compiles of whole ladders, torchrun jobs), slowest first. pytest-xdist hands whole
# files to its workers in collection order (pyproject.toml: --dist loadfile --no-loadscope-reorder), so starting
# these first keeps one worker from being left with a long file at the end.
SLOWEST_FIRST = ("test_hf.py", "test_models.py", "test_config.py", "test_parallel.py", "test_ladder.py",
                 "test_race.py", "test_bench.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its order


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Compiled code and dynamo's counters do not leak from one test into the next."""
    yield
    torch.compiler.reset()


@pytest.fixture(scope="session")
def tiny() -> Workload:
    """The tiny preset on the CPU: a model that trains in milliseconds per step."""
    return prepare(RunConfig(preset="tiny", device="cpu"))


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread (set again here in case a test changed it): on a small shared CPU, two threads of a
    tiny model mostly wait on each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def interrupt_at_window(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """Ctrl-C in the n-th timed window of a run (counting every window, a base's interleaved ones too)."""
    real = timer.time_window
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(timer, "time_window", interrupted)
