"""A StepSpec made real: model, optimizer, precision and compilation.

A TrainStep call does one whole training step (host batch -> device copy ->
forward -> loss -> backward -> AdamW update) and returns the loss as a device
tensor, never a Python number: reading it would synchronize the host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from speedladder.model import GPT, GPTConfig
from speedladder.rungs import MODEL_TRANSFORMS, StepSpec


@contextlib.contextmanager
def matmul_precision(spec: StepSpec) -> Iterator[None]:
    """TF32 is process-wide state: set it for one rung and put it back after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if spec.tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def initial_state(cfg: GPTConfig, seed: int) -> dict[str, torch.Tensor]:
    """The weights every rung starts from, on the host, so each rung sees the same model."""
    torch.manual_seed(seed)
    return {k: v.detach().clone() for k, v in GPT(cfg).state_dict().items()}


class TrainStep:
    def __init__(self, spec: StepSpec, cfg: GPTConfig, init: dict[str, torch.Tensor],
                 device: torch.device, lr: float, wrap: Callable[[nn.Module], nn.Module] | None = None) -> None:
        self.spec = spec
        self.device = device
        self.lr = lr
        self.init = init
        with torch.device(device):
            model = GPT(cfg)
        model.load_state_dict(init)
        # Parameters by their reference names, taken before any transform renames modules.
        self.params = dict(model.named_parameters())
        self.model = model
        for name in spec.transforms:
            self.model = MODEL_TRANSFORMS[name](self.model)
        if wrap is not None:  # e.g. DistributedDataParallel: after the transforms, before compilation
            self.model = wrap(self.model)
        # dynamic=False: one fixed shape per rung; a shape change must recompile, and is counted.
        self.forward = torch.compile(self.model, dynamic=False) if spec.compile else self.model
        self.optimizer = self._new_optimizer()
        self._autocast = torch.autocast(device.type, dtype=torch.bfloat16,
                                        enabled=spec.autocast == "bf16")

    def _new_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=self.lr)

    def reset(self, weights: dict[str, torch.Tensor] | None = None) -> None:
        """Back to the initial weights (or the given ones) with a fresh optimizer; compiled code is kept."""
        weights = self.init if weights is None else weights
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(weights[name])
                p.grad = None
        self.optimizer = self._new_optimizer()

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and loss of one batch, gradients left in .grad; no update."""
        with self._autocast:
            logits, loss = self.forward(x, y)
        loss.backward()
        return logits, loss

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        _, loss = self.forward_backward(x, y)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()
