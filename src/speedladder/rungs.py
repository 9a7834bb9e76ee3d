"""The techniques: each rung is a small pure transform of a step specification.

A StepSpec says everything a training step does differently from plain eager
fp32. A rung maps the spec it is given (the ladder so far) to a new one, states
in one line why that should be faster, and declares what it needs of the
machine. Changes to the model's structure are named model transforms, applied
to a freshly built model, so the model file stays the reference.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from speedladder.model import GPT


@dataclass(frozen=True)
class StepSpec:
    """One training step's configuration; the defaults are R0, eager fp32."""

    batch_size: int
    seq_len: int
    compile: bool = False  # torch.compile the model (forward, loss and backward)
    autocast: str | None = None  # None (fp32) or "bf16"
    tf32: bool = False  # fp32 matmuls on tensor cores (CUDA only)
    transforms: tuple[str, ...] = ()  # names in MODEL_TRANSFORMS, applied in order

    @property
    def precision(self) -> str:
        """The arithmetic the matmuls run in: what the MFU peak and the gate tolerance depend on."""
        if self.autocast == "bf16":
            return "bf16"
        return "tf32" if self.tf32 else "fp32"

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> StepSpec:
        """Back from to_dict (or JSON): lists become the tuples they were."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


@dataclass(frozen=True)
class Env:
    """What a rung may depend on: the machine and the workload's knobs."""

    device_type: str  # "cuda", "mps" or "cpu"
    cuda_capability: tuple[int, int] | None
    batch_multiplier: int


@dataclass(frozen=True)
class Requirement:
    """What a rung needs; `unmet` says why it cannot run here, or None."""

    devices: tuple[str, ...] = ("cuda", "mps", "cpu")
    min_capability: tuple[int, int] | None = None  # CUDA compute capability
    compiler: bool = False  # inductor's code generator: Triton on CUDA, a C++ compiler on CPU

    def unmet(self, env: Env) -> str | None:
        if env.device_type not in self.devices:
            return f"needs {' or '.join(self.devices)}; this device is {env.device_type}"
        if self.min_capability and env.device_type == "cuda":
            cap = env.cuda_capability or (0, 0)
            if cap < self.min_capability:
                want = ".".join(map(str, self.min_capability))
                return f"needs CUDA compute capability >= {want}; this GPU is {cap[0]}.{cap[1]}"
        if self.compiler:
            if env.device_type == "cuda" and importlib.util.find_spec("triton") is None:
                return "torch.compile on CUDA needs Triton, which is not installed"
            if env.device_type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
                return "torch.compile on a CPU needs a C++ compiler (g++ or clang++), none found"
        return None


@dataclass(frozen=True)
class Rung:
    name: str
    reason: str  # one line: why it should pay
    kind: str  # "speed" or "memory": a memory rung is expected to cost speed
    transform: Callable[[StepSpec, Env], StepSpec]
    requires: Requirement = Requirement()
    # A batch-changing rung also measures this variant of its spec, like with like (DESIGN.md rule 6).
    control: Callable[[StepSpec], StepSpec] | None = None
    control_reason: str | None = None


class Checkpointed(nn.Module):
    """Runs a block under activation checkpointing: keep its input, recompute the rest in backward."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False)


def checkpoint_blocks(model: GPT) -> GPT:
    model.blocks = nn.ModuleList(Checkpointed(b) for b in model.blocks)
    return model


# Model transforms keep every parameter object, so weights loaded before them stay in place.
MODEL_TRANSFORMS: dict[str, Callable[[GPT], nn.Module]] = {
    "activation-checkpointing": checkpoint_blocks,
}


def _fp32_control(spec: StepSpec) -> StepSpec:
    return dataclasses.replace(spec, autocast=None, tf32=False)


RUNGS: dict[str, Rung] = {r.name: r for r in (
    Rung("eager", "R0: the baseline, eager PyTorch in fp32", "speed",
         lambda s, e: s),
    Rung("compile", "R1: fuse the elementwise tail into fewer kernels, cut Python dispatch", "speed",
         lambda s, e: dataclasses.replace(s, compile=True),
         Requirement(compiler=True)),
    Rung("bf16", "R2: bf16 autocast halves bytes and runs matmuls on tensor cores; TF32 for what stays fp32",
         "speed",
         lambda s, e: dataclasses.replace(s, autocast="bf16", tf32=e.device_type == "cuda"),
         Requirement(min_capability=(8, 0))),
    Rung("batch", "R3: a bigger batch fills the device and spreads per-step overhead over more tokens",
         "speed",
         lambda s, e: dataclasses.replace(s, batch_size=s.batch_size * e.batch_multiplier),
         control=_fp32_control,
         control_reason="the same batch in fp32: did bf16 buy the memory headroom for it?"),
    Rung("ckpt", "R4: activation checkpointing per block trades one recomputed forward for activation memory",
         "memory",
         lambda s, e: dataclasses.replace(s, transforms=(*s.transforms, "activation-checkpointing"))),
)}


def compose(names: tuple[str, ...], spec: StepSpec, env: Env) -> StepSpec:
    """The spec that the named rungs give when each is applied to the last, with no gates in between."""
    for name in names:
        spec = RUNGS[name].transform(spec, env)
    return spec
