from __future__ import annotations

import pytest
import torch

from speedladder.config import RunConfig
from speedladder.ladder import Workload, prepare


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Compiled code and dynamo's counters do not leak from one test into the next."""
    yield
    torch.compiler.reset()


@pytest.fixture(scope="session")
def tiny() -> Workload:
    """The tiny preset on the CPU: a model that trains in milliseconds per step."""
    return prepare(RunConfig(preset="tiny", device="cpu"))
