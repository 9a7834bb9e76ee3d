"""Our GPT (models/gpt.py) as a family: how to build it, and what we know of it without looking."""

from __future__ import annotations

import functools

from torch import nn

from speedladder.models.definition import Formula, ModelFamily, TransformTable
from speedladder.models.gpt import GPT, GPTConfig


def family(cfg: GPTConfig, preset: str | None = None) -> ModelFamily:
    """The bundled GPT: forward(x, y) -> (logits, loss), no dropout; the rungs' own transforms are written for it,
    so it offers none of its own."""
    return ModelFamily(kind="speedladder", name=f"speedladder GPT{f' ({preset})' if preset else ''}",
                  factory=functools.partial(GPT, cfg), offers=offers, source={"preset": preset},
                  formula=formula, convention="logits_loss", vocab_size=cfg.vocab_size,
                  dropout="none: the model has no dropout", shapes=cfg)


def offers(model: nn.Module, blocks: str | None) -> TransformTable:
    """Nothing over the rungs' own transforms, which are written for our GPT."""
    return TransformTable()


def formula(model: nn.Module) -> Formula:
    """PaLM's formula's terms, from the GPT's own counts."""
    assert isinstance(model, GPT)  # the factory's
    cfg = model.cfg
    return model.matmul_params(), (cfg.n_layer, cfg.n_head, cfg.head_dim)
