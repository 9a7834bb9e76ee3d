"""Planted: a candidate that caches its outputs across steps: every other call returns the previous call's logits and
loss without computing anything (a step at half the cost that learns half as much)."""

import torch
from torch import nn

import speedladder


class Stale(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.calls, self.last = model, 0, None

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        self.calls += 1
        if self.last is not None and self.calls % 2 == 0:
            return tuple(t.detach().requires_grad_() for t in self.last)  # the last call's outputs, again
        out = self.model(idx, targets)
        self.last = out
        return out


@speedladder.rung("stale", "skips every other forward by reusing the last one", kind="speed")
def stale(model: nn.Module) -> nn.Module:
    return Stale(model)
