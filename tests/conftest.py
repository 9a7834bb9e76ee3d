from __future__ import annotations

import os

# One intra-op thread for the tests and every process they start (profile children, torchrun ranks, bench
# scripts): on a shared 2-core machine two OpenMP threads spin against whatever else runs and a tiny step can
# take 100x longer. The tests check behaviour and numbers, not speed (benchmarks measure speed).
os.environ["OMP_NUM_THREADS"] = "1"

import pytest
import torch

from speedladder.config import RunConfig
from speedladder.workload import Workload, prepare

torch.set_num_threads(1)

# The files that take longest (cold compiles of whole ladders, torchrun jobs), slowest first. pytest-xdist hands whole
# files to its workers in collection order (pyproject.toml: --dist loadfile --no-loadscope-reorder), so starting
# these first keeps one worker from being left with a long file at the end.
SLOWEST_FIRST = ("test_hf.py", "test_models.py", "test_parallel.py", "test_ladder.py")


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
