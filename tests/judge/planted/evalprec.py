"""Planted: a candidate that lowers the evaluation's precision: in eval mode its forward runs under bf16 autocast
(cheaper, and another function), in training mode as before."""

import torch
from torch import nn

import speedladder


class EvalInBf16(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        if self.training:
            return self.model(idx, targets)
        with torch.autocast(idx.device.type, dtype=torch.bfloat16):
            return self.model(idx, targets)


@speedladder.rung("eval-bf16", "evaluates in bf16, trains in fp32", kind="speed")
def eval_bf16(model: nn.Module) -> nn.Module:
    return EvalInBf16(model)
