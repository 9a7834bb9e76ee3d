"""A rung of your own: the MLP's two matmuls with the bias folded into each (torch.addmm), a stand-in for a
fused kernel. The same function, so it is a speed rung: every gate applies (docs/rungs.md)."""

import torch
from torch import nn

import speedladder


class FusedMLP(nn.Module):
    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        self.fc, self.act, self.proj = mlp.fc, mlp.act, mlp.proj  # the same parameters, adopted

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.addmm(self.fc.bias, x.flatten(0, -2), self.fc.weight.t())  # bias + x @ W^T in one call
        y = torch.addmm(self.proj.bias, self.act(h), self.proj.weight.t())
        return y.view(*x.shape[:-1], -1)


@speedladder.rung("fused-mlp", "each MLP matmul and its bias in one addmm call: fewer kernels", kind="speed")
def fused_mlp(model: nn.Module) -> nn.Module:
    for block in model.blocks:
        block.mlp = FusedMLP(block.mlp)
    return model
