"""Planted: a candidate that sees future tokens: every block's causal mask opened, so each position attends to the
ones after it and predicts the next token by reading it."""

from torch import nn

import speedladder


@speedladder.rung("peek", "attention without its causal mask", kind="speed")
def peek(model: nn.Module) -> nn.Module:
    for block in model.blocks:
        block.attn.causal_mask.fill_(True)
    return model
