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
