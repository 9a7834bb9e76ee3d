"""Our GPT (gpt.py) as a ModelDef: the same record every other model gets, with what we know of it."""

from __future__ import annotations

import functools

import torch

from speedladder.gpt import GPT, GPTConfig
from speedladder.models.base import ModelDef, hooks_of


def ours(cfg: GPTConfig, preset: str | None = None) -> ModelDef:
    """The bundled GPT: forward(x, y) -> (logits, loss); the rungs' own transforms are written for it."""
    with torch.device("meta"):  # counted without allocating
        model = GPT(cfg)
    return ModelDef(
        kind="speedladder", name=f"speedladder GPT{f' ({preset})' if preset else ''}",
        factory=functools.partial(GPT, cfg), convention="logits_loss", vocab_size=cfg.vocab_size,
        params=model.num_params(), matmul_params=model.matmul_params(),
        attention=(cfg.n_layer, cfg.n_head, cfg.head_dim), blocks="blocks",
        dropout="none: the model has no dropout", shapes=cfg, source={"preset": preset}, hooks=hooks_of(model))
